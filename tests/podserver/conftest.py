from __future__ import annotations

import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from podserver.server import PodServer, make_server

from .helpers import PAGE_LINES, encode, render

REPO = Path(__file__).resolve().parents[2]
# Generous guards against hangs only; no test asserts how long anything takes.
HANG_GUARD = 60.0


@pytest.fixture(scope="session")
def page_png() -> bytes:
    return encode(render(PAGE_LINES))


class Pod:
    """A `python -m podserver` subprocess and the URL it announced."""

    def __init__(self, *args: str, env: dict[str, str] | None = None, stderr: object = None) -> None:
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
            **(env or {}),
        }
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "podserver", "--port", "0", *args],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
        )
        self.url = self._read_listening_line()

    def _read_listening_line(self) -> str:
        lines: queue.Queue[str] = queue.Queue()
        assert self.proc.stdout is not None
        threading.Thread(target=lambda: lines.put(self.proc.stdout.readline()), daemon=True).start()
        try:
            line = lines.get(timeout=HANG_GUARD)
        except queue.Empty:
            self.stop()
            pytest.fail("pod server never printed its LISTENING line")
        assert line.startswith("LISTENING http://"), line
        return line.split()[1]

    def wait_ready(self) -> None:
        deadline = time.monotonic() + HANG_GUARD
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"pod server exited with {self.proc.returncode}")
            if httpx.get(f"{self.url}/healthz").status_code == 200:
                return
            time.sleep(0.05)
        pytest.fail("pod server never became ready")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=HANG_GUARD)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stdout:
            self.proc.stdout.close()


@pytest.fixture
def spawn_pod() -> Iterator[Callable[..., Pod]]:
    pods: list[Pod] = []

    def spawn(*args: str, **kwargs: object) -> Pod:
        pods.append(Pod(*args, **kwargs))
        return pods[-1]

    yield spawn
    for pod in pods:
        pod.stop()


@pytest.fixture(scope="module")
def pod() -> Iterator[Pod]:
    """One real pod server subprocess with two lanes, shared by a module's tests."""
    pod = Pod("--lanes", "2", "--name", "pod-under-test")
    try:
        pod.wait_ready()
        yield pod
    finally:
        pod.stop()


@pytest.fixture
def start_server(tmp_path: Path) -> Iterator[Callable[..., tuple[PodServer, str]]]:
    """Start in-process servers (server.lanes is the semaphore), engine loaded."""
    servers: list[PodServer] = []

    def start(wait: bool = True, **kwargs: object) -> tuple[PodServer, str]:
        cache_dir = tmp_path / f"documents-{len(servers)}"
        options: dict[str, object] = {"host": "127.0.0.1", "port": 0, "name": "inproc", "cache_dir": str(cache_dir)}
        options.update(kwargs)
        server = make_server(**options)  # type: ignore[arg-type]
        servers.append(server)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        if wait:
            assert server.loaded.wait(HANG_GUARD)
        return server, server.url

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()
