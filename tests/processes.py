"""Real fleetadmin processes for tests: daphne and qcluster on the test database."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
from django.conf import settings
from django.db import connection

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def database_env() -> dict[str, str]:
    """Point a child process at the database this test session uses."""
    db = connection.settings_dict
    if db["ENGINE"].endswith("sqlite3"):
        return {"SQLITE_PATH": str(db["NAME"])}
    auth = db["USER"] + (f":{db['PASSWORD']}" if db["PASSWORD"] else "")
    return {"DATABASE_URL": f"postgres://{auth}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"}


def child_env(var_dir: Path, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(database_env())
    env.update(
        FLEETADMIN_VAR_DIR=str(var_dir),
        MEDIA_ROOT=str(settings.MEDIA_ROOT),
        FLEETADMIN_DEPLOYMENT=settings.DEPLOYMENT_PREFIX,
        SECRET_KEY=settings.SECRET_KEY,
        OMP_THREAD_LIMIT="1",
        PYTHONUNBUFFERED="1",
    )
    env.update(extra)
    return env


class Process:
    def __init__(self, name: str, argv: list[str], env: dict[str, str], log_dir: Path):
        self.name = name
        self.log_path = log_dir / f"{name}.log"
        self.log = open(self.log_path, "wb")
        self.popen = subprocess.Popen(argv, cwd=REPO, env=env, stdout=self.log, stderr=subprocess.STDOUT)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(sig)
            try:
                self.popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()
        self.log.close()

    def tail(self, lines: int = 40) -> str:
        text = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])


def start_front(env: dict[str, str], log_dir: Path) -> tuple[Process, str]:
    port = free_port()
    front = Process(
        "daphne",
        [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "fleetadmin.asgi:application"],
        env,
        log_dir,
    )
    url = f"http://127.0.0.1:{port}"
    wait_for(lambda: _answers(f"{url}/healthz"), 30, f"daphne did not answer:\n{front.tail()}")
    return front, url


def start_workers(env: dict[str, str], log_dir: Path, name: str = "qcluster") -> Process:
    return Process(name, [sys.executable, "manage.py", "qcluster"], env, log_dir)


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def wait_for(predicate, timeout: float, message: str, interval: float = 0.2):
    """Poll until predicate() is truthy; a guard against hangs, not a timing assertion."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(message() if callable(message) else message)
        time.sleep(interval)
