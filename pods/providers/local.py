"""Local pods: pod servers started as subprocesses on free loopback ports.

The process table is the provider's own record, as RunPod's API is for cloud
pods: a pod is found again by the ``--name`` on its command line, so a worker
that restarted (or crashed between create and save) can still list, adopt or
terminate what it started.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from django.conf import settings

from pods.providers.base import Offer, PodSpec, ProviderError, ProviderPod

LOCAL_OFFER = Offer(gpu_type="cpu-tesseract", cloud_type="LOCAL", data_center="localhost")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _read_proc(pid: int) -> tuple[list[str], str, float] | None:
    """(argv, state letter, age in seconds) of a live process, or None."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # The state letter follows the parenthesised command name, which may hold spaces.
    fields = stat[stat.rindex(")") + 2 :].split()
    state = fields[0]
    start_ticks = int(fields[19])
    uptime = float(Path("/proc/uptime").read_text().split()[0])
    age = max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    return [a.decode(errors="replace") for a in argv if a], state, age


def _pod_from_proc(pid: int) -> ProviderPod | None:
    info = _read_proc(pid)
    if info is None:
        return None
    argv, state, age = info
    if state in ("Z", "X") or "podserver" not in argv:
        return None
    try:
        name = argv[argv.index("--name") + 1]
        port = int(argv[argv.index("--port") + 1])
    except (ValueError, IndexError):
        return None
    return ProviderPod(
        provider_id=str(pid),
        name=name,
        running=True,
        base_url=f"http://127.0.0.1:{port}",
        age_seconds=age,
    )


class LocalProvider:
    name = "local"

    def create(self, spec: PodSpec) -> ProviderPod:
        port = free_port()
        env = {**os.environ, "OMP_THREAD_LIMIT": "1", **spec.env}
        log_dir = settings.VAR_DIR / "pods"
        log_dir.mkdir(parents=True, exist_ok=True)
        with open(log_dir / f"{spec.name}.log", "ab") as log:
            process = subprocess.Popen(
                [
                    sys.executable, "-m", "podserver",
                    "--host", "127.0.0.1",
                    "--port", str(port),
                    "--lanes", str(spec.lanes),
                    "--page-timeout", str(spec.page_timeout),
                    "--name", spec.name,
                ],
                cwd=settings.BASE_DIR,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                # The pod is the provider's, not the worker's: like a RunPod pod it outlives a restart
                # of the workers, which kills their process group (fleetadmin.workers).
                start_new_session=True,
            )  # fmt: skip
        # /proc may show the forked parent's command line for a moment after
        # the spawn; wait until it shows the pod's own, so get() finds it.
        deadline = time.monotonic() + 5
        while _pod_from_proc(process.pid) is None:
            if process.poll() is not None:
                raise ProviderError(f"the pod server exited with code {process.returncode} at start")
            if time.monotonic() > deadline:
                break
            time.sleep(0.01)
        return ProviderPod(provider_id=str(process.pid), name=spec.name, running=False, base_url="")

    def get(self, provider_id: str) -> ProviderPod | None:
        try:
            pid = int(provider_id)
        except ValueError:
            return None
        return _pod_from_proc(pid)

    def list(self, *, prefix: str) -> list[ProviderPod]:
        pods = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                pod = _pod_from_proc(int(entry.name))
                if pod is not None and pod.name.startswith(prefix):
                    pods.append(pod)
        return pods

    def terminate(self, provider_id: str) -> None:
        """Stop the pod; a pod that is already gone counts as terminated."""
        if self.get(provider_id) is None:
            return
        pid = int(provider_id)
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            _reap(pid)
            if self.get(provider_id) is None:
                return
            time.sleep(0.05)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        _reap(pid)
        if self.get(provider_id) is not None:
            raise ProviderError(f"local pod {pid} survived SIGKILL")

    def catalogue(self) -> list[Offer]:
        return [LOCAL_OFFER]


def _reap(pid: int) -> None:
    # A pod started by this process stays a zombie until waited for.
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass
