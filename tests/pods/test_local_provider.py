"""The local provider starts real pod servers as subprocesses and finds them again."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import httpx
import pytest

from pods.podclient import pod_is_serving
from pods.providers import local
from pods.providers.base import PodSpec
from pods.providers.local import LOCAL_OFFER, LocalProvider
from tests.factories import pdf_bytes
from tests.podserver.helpers import encode, render
from tools.processes import wait_for


@pytest.fixture
def provider(settings, tmp_path):
    settings.VAR_DIR = tmp_path
    settings.DEPLOYMENT_PREFIX = f"t{uuid.uuid4().hex[:6]}"
    provider = LocalProvider()
    yield provider
    for pod in provider.list(prefix=settings.DEPLOYMENT_PREFIX):
        provider.terminate(pod.provider_id)


def _spec(settings, suffix="a", lanes=1):
    return PodSpec(name=f"{settings.DEPLOYMENT_PREFIX}-local-{suffix}", lanes=lanes, offer=LOCAL_OFFER)


def test_a_created_pod_serves_and_is_listed_by_its_prefix(provider, settings):
    created = provider.create(_spec(settings, lanes=2))

    def listening():
        seen = provider.get(created.provider_id)
        return seen if seen and seen.base_url else None  # its address once it listens

    seen = wait_for(listening, 30, "the pod never listened")
    assert seen.running and seen.base_url.startswith("http://127.0.0.1:")
    wait_for(lambda: pod_is_serving(seen.base_url), 30, "the pod never became ready")
    listed = provider.list(prefix=settings.DEPLOYMENT_PREFIX)
    assert [p.provider_id for p in listed] == [created.provider_id]
    assert provider.list(prefix="some-other-deployment") == []


def test_terminate_stops_the_process_and_is_idempotent(provider, settings):
    created = provider.create(_spec(settings))
    wait_for(lambda: provider.get(created.provider_id), 30, "the pod never appeared")
    provider.terminate(created.provider_id)
    assert provider.get(created.provider_id) is None
    provider.terminate(created.provider_id)  # already gone: no error
    assert provider.list(prefix=settings.DEPLOYMENT_PREFIX) == []


def test_a_pod_that_died_is_no_longer_found(provider, settings):
    created = provider.create(_spec(settings))
    wait_for(lambda: provider.get(created.provider_id), 30, "the pod never appeared")
    os.kill(int(created.provider_id), signal.SIGKILL)

    def gone():
        try:
            os.waitpid(int(created.provider_id), os.WNOHANG)  # our child: reap it
        except ChildProcessError:
            pass
        return provider.get(created.provider_id) is None

    wait_for(gone, 10, "a killed pod is still reported")


def test_get_refuses_an_id_that_is_not_a_pod(provider):
    assert provider.get("not-a-pid") is None
    assert provider.get(str(os.getpid())) is None  # a live process, but not a pod server


def _serving_url(provider: LocalProvider, provider_id: str) -> str | None:
    """The pod's address once the provider reports it running there and a pod answers ready
    there: what a boot waits for before it joins the pod."""
    seen = provider.get(provider_id)
    return seen.base_url if seen and seen.base_url and pod_is_serving(seen.base_url) else None


def test_a_pod_whose_port_is_taken_before_it_binds_it_is_never_reported_at_another_pods_address(
    provider, settings, monkeypatch
):
    first = provider.create(_spec(settings, "a"))
    first_url = wait_for(lambda: _serving_url(provider, first.provider_id), 30, "the first pod never served")
    # A port found free is free no longer when the pod binds it: another pod booted at the same moment
    # (or an outgoing connection's ephemeral port) took it. Here the first pod holds it, answering ready.
    monkeypatch.setattr(local, "free_port", lambda: int(first_url.rsplit(":", 1)[1]))
    second = _spec(settings, "b")

    created = provider.create(second)
    url = wait_for(lambda: _serving_url(provider, created.provider_id), 30, "the second pod never served")

    # Before, it was reported at the first pod's address, which answered ready: joined there, it died
    # (its port was taken) and vanished from the provider while the database listed it ready.
    assert url != first_url
    assert httpx.get(f"{url}/v1/models", timeout=5).json()["name"] == second.name


FORKING_POD = """
import os, sys, time
child = os.fork()
if child == 0:
    time.sleep(60)  # between fork and exec, as a pod's tesseract child is for a moment: the pod's command line
    os._exit(0)
print(child, flush=True)
time.sleep(60)
"""


def test_a_pods_child_between_fork_and_exec_is_not_listed_as_a_pod(provider, settings):
    name = f"{settings.DEPLOYMENT_PREFIX}-local-forking"
    argv = [sys.executable, "-c", FORKING_POD, "podserver", "--host", "127.0.0.1", "--port", "0", "--name", name]
    pod = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        child = int(pod.stdout.readline())

        listed = provider.list(prefix=settings.DEPLOYMENT_PREFIX)

        assert [p.provider_id for p in listed] == [str(pod.pid)]  # not str(child) too: one pod, listed once
        assert provider.get(str(child)) is None
    finally:
        os.killpg(pod.pid, signal.SIGKILL)
        pod.wait()
        pod.stdout.close()


CONTROL_PLANE_SECRETS = {
    "SECRET_KEY": "control-plane-secret-key",
    "SECRET_KEY_FILE": "/run/secrets/secret_key",
    "DATABASE_URL": "postgres://fleetadmin:db-password@db:5432/fleetadmin",
    "REDIS_URL": "redis://:redis-password@redis:6379/0",
    "RUNPOD_API_KEY": "rp-control-plane-key",
    "AWS_SECRET_ACCESS_KEY": "s3-secret",
    "SOME_OTHER_CONTROL_PLANE_SETTING": "x",
}


def _environ_of(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(item.decode().split("=", 1) for item in raw.split(b"\0") if item)


def test_a_local_pod_gets_none_of_the_control_planes_secrets_and_still_reads_a_page(provider, settings, monkeypatch):
    for name, value in CONTROL_PLANE_SECRETS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("LC_ALL", "C.UTF-8")  # the locale's variables do go through
    spec = PodSpec(name=f"{settings.DEPLOYMENT_PREFIX}-local-env", lanes=1, offer=LOCAL_OFFER,
                   env={"POD_TOKEN": "the-pods-own-token"})  # fmt: skip

    created = provider.create(spec)
    url = wait_for(lambda: (seen := provider.get(created.provider_id)) and seen.base_url, 30, "it never listened")
    wait_for(lambda: pod_is_serving(url, token="the-pods-own-token"), 30, "the pod never served")

    environ = _environ_of(int(created.provider_id))
    assert not set(CONTROL_PLANE_SECRETS) & set(environ), sorted(environ)
    assert not any(value in environ.values() for value in CONTROL_PLANE_SECRETS.values())
    assert environ["POD_TOKEN"] == "the-pods-own-token"
    assert environ["OMP_THREAD_LIMIT"] == "1" and environ["LC_ALL"] == "C.UTF-8"
    assert environ["PATH"] == os.environ["PATH"]
    page = encode(render(["Allowed environment only."]))
    answer = httpx.post(f"{url}/v1/ocr", content=page, timeout=60,
                        headers={"Authorization": "Bearer the-pods-own-token"})  # fmt: skip
    assert answer.status_code == 200, answer.text
    assert "Allowed environment only" in answer.json()["text"]


def test_a_local_pod_gets_the_engines_knobs_and_none_of_the_control_planes_secrets(monkeypatch):
    monkeypatch.setenv("TESSERACT_API", "false")
    monkeypatch.setenv("SECRET_KEY", "not-for-pods")
    env = local.pod_environment({"POD_TOKEN": "t"})
    assert env["TESSERACT_API"] == "false" and env["POD_TOKEN"] == "t" and env["OMP_THREAD_LIMIT"] == "1"
    assert "SECRET_KEY" not in env


# --- a local pod confined to its own files (issue 38, M8) -----------------------------------------

PROBE = """
import os, signal, sys
from podserver.sandbox import confine_from_environment
print(confine_from_environment())
def tried(what, action):
    try:
        action()
        print(what, "allowed")
    except OSError as exc:
        print(what, "refused", type(exc).__name__)
tried("secret", lambda: open(sys.argv[1]).read())
tried("environ", lambda: open(f"/proc/{os.getppid()}/environ", "rb").read())
tried("signal", lambda: os.kill(os.getppid(), 0))
tried("own", lambda: open(os.path.join(os.environ["TMPDIR"], "x"), "w").write("x"))
tried("engine", lambda: __import__("pytesseract").get_tesseract_version())
"""


def _landlock() -> bool:
    import landlockpy

    return landlockpy.abi_version() > 0


@pytest.mark.skipif(not _landlock(), reason="this kernel has no Landlock")
def test_a_local_pod_cannot_read_the_control_planes_files_nor_its_processes(settings, tmp_path):
    settings.VAR_DIR = tmp_path
    secret = tmp_path / "secret_key"
    secret.write_text("the control plane's key")
    own, env = local.pod_sandbox("t-sandbox-pod")
    env = {**local.pod_environment({}), **env}

    # The pod server's own code path (podserver.sandbox), with the paths the provider gives a pod.
    probe = subprocess.run([sys.executable, "-c", PROBE, str(secret)], cwd=own, env=env, capture_output=True,
                           text=True, timeout=60)  # fmt: skip

    lines = probe.stdout.splitlines()
    assert lines[0].startswith("confined (Landlock ABI"), probe.stdout + probe.stderr
    assert "secret refused PermissionError" in lines
    assert "environ refused PermissionError" in lines  # the workers' environment through /proc
    assert "signal refused PermissionError" in lines
    assert "own allowed" in lines and "engine allowed" in lines


def test_without_the_sandbox_setting_a_pod_is_not_confined(settings, tmp_path):
    settings.VAR_DIR = tmp_path
    settings.LOCAL_POD_SANDBOX = False

    own, env = local.pod_sandbox("t-open-pod")

    assert own == tmp_path / "pods" / "t-open-pod" and "POD_SANDBOX_READ" not in env
    assert env["TMPDIR"].startswith(str(own))


@pytest.mark.skipif(not _landlock(), reason="this kernel has no Landlock")
def test_a_confined_local_pod_reads_a_page_and_its_directory_goes_with_it(provider, settings):
    created = provider.create(_spec(settings, suffix="confined"))
    url = wait_for(lambda: (seen := provider.get(created.provider_id)) and seen.base_url, 30, "it never listened")
    wait_for(lambda: pod_is_serving(url), 30, "the pod never served")

    answer = httpx.post(f"{url}/v1/ocr", content=encode(render(["Confined to its files."])), timeout=60)
    document = pdf_bytes([["A confined pod renders PDF pages."]])
    sha256 = hashlib.sha256(document).hexdigest()
    stored = httpx.put(f"{url}/v1/documents/{sha256}", content=document, timeout=60)
    page = httpx.post(f"{url}/v1/ocr", json={"document": sha256, "page": 1}, timeout=60)  # rendered in a child

    assert answer.status_code == 200 and "Confined to its files" in answer.json()["text"], answer.text
    assert stored.status_code == 201 and page.status_code == 200, page.text
    assert "renders PDF pages" in page.json()["text"]
    log = (settings.VAR_DIR / "pods" / f"{_spec(settings, suffix='confined').name}.log").read_text()
    assert "podserver: confined (Landlock ABI" in log
    own = settings.VAR_DIR / "pods" / _spec(settings, suffix="confined").name
    assert own.is_dir()
    provider.terminate(created.provider_id)
    assert not own.exists()
