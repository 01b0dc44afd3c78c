"""Real fleetadmin processes for tests: daphne and the workers (qcluster) on the test database."""

from __future__ import annotations

import contextlib
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

from fleetadmin.workers import processes

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
    """A child in a session of its own, so that stop() finds every process it started."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], log_dir: Path):
        self.name = name
        self.log_path = log_dir / f"{name}.log"
        self.log = open(self.log_path, "wb")
        self.popen = subprocess.Popen(
            argv, cwd=REPO, env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True
        )

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> None:
        """Signal the process group, then kill whatever of the session is left.

        The session holds the whole tree, also the workers' cluster, which the supervisor runs in a
        process group of its own; local pods start sessions of their own and are left to the
        ``deployment`` fixture.
        """
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, sig)
            try:
                self.popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                pass
        session, deadline = self.popen.pid, time.monotonic() + timeout
        while (left := [p for p in processes() if p.session == session and p.state not in "ZX"]) and (
            time.monotonic() < deadline
        ):
            for process in left:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, signal.SIGKILL)
            self.popen.poll()  # reaps the leader
            time.sleep(0.05)
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
    """The workers as production runs them: the supervisor and its django-q2 cluster."""
    return Process(name, [sys.executable, "manage.py", "workers"], env, log_dir)


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
