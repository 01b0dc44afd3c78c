"""Local pods: pod servers started as subprocesses on loopback ports of their own.

The process table is the provider's own record, as RunPod's API is for cloud
pods: a pod is found again by the ``--name`` on its command line, so a worker
that restarted (or crashed between create and save) can still list, adopt or
terminate what it started.

A pod binds a port the kernel picks (``--port 0``) and its address is the port its
own listening socket has (read through /proc), never a port chosen for it before it
started: a port found free by binding and closing it can be taken by anyone before
the pod binds it (an outgoing connection, a pod started at the same moment). A pod
given such a port died on start, but was reported at that address, where another
pod answered ready: its boot joined it there, and it vanished while the database
listed it ready.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from django.conf import settings

from pods.providers.base import Offer, PodSpec, ProviderError, ProviderPod
from podserver import sandbox  # the pod server's package names its variables

LOCAL_OFFER = Offer(gpu_type="cpu-tesseract", cloud_type="LOCAL", data_center="localhost")

# What a local pod gets of the control plane's environment: what Python, tesseract and the locale
# need, and the pod server's own knobs (its engine, cache and device). Nothing else: a pod reads
# untrusted documents, and a parser exploit there must not find SECRET_KEY, DATABASE_URL,
# RUNPOD_API_KEY or the bucket's keys (issue 23). The pod's token comes in its spec.
POD_ENV_NAMES = frozenset(
    {
        "PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TZ", "TMPDIR", "TMP", "TEMP",
        "LD_LIBRARY_PATH", "PYTHONPATH", "PYTHONUNBUFFERED", "VIRTUAL_ENV", "TESSDATA_PREFIX",
        "CUDA_VISIBLE_DEVICES",
        # podserver/config.py and its engines
        "ENGINE", "MODEL", "DEVICE", "DOCUMENT_CACHE_DIR", "DOCUMENT_CACHE_BYTES", "MAX_DOCUMENT_BYTES",
        "RAPIDOCR_THREADS", "TESSERACT_API", "CUDA_DEVICE_ID", "VLM_URL", "VLM_API_KEY", "VLM_START_TIMEOUT",
    }
)  # fmt: skip
POD_ENV_PREFIXES = ("LC_", "OMP_")


def pod_environment(spec_env: dict[str, str]) -> dict[str, str]:
    """A local pod's environment: the allowed part of this process's, one thread per OCR call,
    then the spec's own variables (its token)."""
    inherited = {k: v for k, v in os.environ.items() if k in POD_ENV_NAMES or k.startswith(POD_ENV_PREFIXES)}
    return {**inherited, "OMP_THREAD_LIMIT": "1", **spec_env}


# What a local pod may read (podserver/sandbox.py): the system's programs, libraries and settings,
# tesseract's data, Python and its libraries, and the pod server's own package; of /proc, its own
# process (``/proc/self`` is opened by the pod itself) and what the machine is, not another
# process's environment or memory. It writes only its own directory (var/pods/<name>/: documents,
# temporary files) and /dev (null, shm).
SANDBOX_SYSTEM = (
    "/usr", "/lib", "/lib64", "/bin", "/sbin", "/etc", "/sys", "/opt",
    "/proc/self", "/proc/cpuinfo", "/proc/meminfo", "/proc/stat",
)  # fmt: skip


def pod_sandbox(name: str) -> tuple[Path, dict[str, str]]:
    """A local pod's own directory (its working directory) and the environment that confines it
    there (podserver.sandbox), unless LOCAL_POD_SANDBOX is off."""
    own = Path(settings.VAR_DIR) / "pods" / name
    (own / "tmp").mkdir(parents=True, exist_ok=True)
    env = {
        "TMPDIR": str(own / "tmp"),
        "DOCUMENT_CACHE_DIR": str(own / "documents"),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(settings.BASE_DIR), os.environ.get("PYTHONPATH")])),
    }
    if not settings.LOCAL_POD_SANDBOX:
        return own, env
    python = {sys.prefix, sys.base_prefix, sys.exec_prefix, *(p for p in sys.path if p and os.path.isdir(p))}
    python.discard(str(settings.BASE_DIR))  # its pod server only, not the rest (var/ above all)
    read = [*SANDBOX_SYSTEM, *sorted({os.path.realpath(p) for p in python}), str(Path(settings.BASE_DIR) / "podserver")]
    read += [os.environ[name] for name in ("TESSDATA_PREFIX",) if os.environ.get(name)]
    env[sandbox.READ_ENV] = os.pathsep.join(read)
    env[sandbox.WRITE_ENV] = os.pathsep.join([str(own), "/dev"])
    env[sandbox.LIST_ENV] = str(settings.BASE_DIR)
    return own, env


def free_port() -> int:
    """A port free now, maybe not a moment later: only for a child that fails loudly when it is taken."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _read_proc(pid: int) -> tuple[list[str], str, int, float] | None:
    """(argv, state letter, parent pid, age in seconds) of a live process, or None."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # The state letter follows the parenthesised command name, which may hold spaces.
    fields = stat[stat.rindex(")") + 2 :].split()
    state, parent = fields[0], int(fields[1])
    start_ticks = int(fields[19])
    uptime = float(Path("/proc/uptime").read_text().split()[0])
    age = max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    return [a.decode(errors="replace") for a in argv if a], state, parent, age


def listening_port(pid: int) -> int | None:
    """The TCP port that the process's own listening socket has, or None before it listens."""
    sockets = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:  # closed in between
                continue
            if target.startswith("socket:["):
                sockets.add(target[len("socket:[") : -1])
        if not sockets:
            return None
        for table in ("tcp", "tcp6"):
            for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
                fields = line.split()  # sl local_address rem_address st ... uid timeout inode
                if fields[3] == "0A" and fields[9] in sockets:  # 0A: LISTEN
                    return int(fields[1].rsplit(":", 1)[1], 16)
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    return None


def _pod_from_proc(pid: int) -> ProviderPod | None:
    info = _read_proc(pid)
    if info is None:
        return None
    argv, state, parent, age = info
    if state in ("Z", "X") or "podserver" not in argv:
        return None
    try:
        name = argv[argv.index("--name") + 1]
    except (ValueError, IndexError):
        return None
    parent_info = _read_proc(parent)
    if parent_info is not None and parent_info[0] == argv:
        # A pod's child between fork and exec (tesseract, for a moment) shows the pod's command line.
        return None
    port = listening_port(pid)
    return ProviderPod(
        provider_id=str(pid),
        name=name,
        running=True,
        base_url=f"http://127.0.0.1:{port}" if port else "",  # its own address, once it listens
        age_seconds=age,
    )


class LocalProvider:
    name = "local"

    def create(self, spec: PodSpec) -> ProviderPod:
        own, confined = pod_sandbox(spec.name)
        env = {**pod_environment(spec.env), **confined}
        log_dir = settings.VAR_DIR / "pods"
        log_dir.mkdir(parents=True, exist_ok=True)
        with open(log_dir / f"{spec.name}.log", "ab") as log:
            process = subprocess.Popen(
                [
                    sys.executable, "-m", "podserver",
                    "--host", "127.0.0.1",
                    "--port", "0",  # the kernel's pick, taken at once: see the module's docstring
                    "--lanes", str(spec.lanes),
                    "--page-timeout", str(spec.page_timeout),
                    "--name", spec.name,
                ],
                cwd=own,
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
        """Stop the pod; a pod that is already gone counts as terminated. Its directory goes with it."""
        pod = self.get(provider_id)
        if pod is None:
            return
        try:
            self._stop(provider_id)
        finally:
            if self.get(provider_id) is None:
                shutil.rmtree(Path(settings.VAR_DIR) / "pods" / pod.name, ignore_errors=True)

    def _stop(self, provider_id: str) -> None:
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
