"""The pod image's Python environment, built the way deploy/pod/Dockerfile.cpu builds it, serves pages.

No container builder runs here, so the test does what the Dockerfile does, outside a container:
a fresh virtual environment, ``pip install -c constraints.txt "podserver[tesseract,rapidocr]"``
from a copy of the package (the image COPYs it), then deploy/pod/entrypoint.sh with the
environment a RunPod pod gets. The pod server then runs from the installed package, not the
repository. For ENGINE=vlm a stand-in ``vllm`` on PATH plays vLLM (it checks the entrypoint's
wiring, not a model).

pip fetches the packages from PyPI (about 15 s here). The pod server touches no database, so the
test runs once in CI, on the embedded run.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from pods.providers.local import free_port
from tests.factories import PAGES_TRUTH, accuracy, pdf_bytes

from .conftest import HANG_GUARD, REPO, Pod

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.once_sqlite,  # no database involved
]

ENTRYPOINT = REPO / "deploy" / "pod" / "entrypoint.sh"
TOKEN = "image-env-token-7c1b"
INSTALL_TIMEOUT = 900


@pytest.fixture(scope="module")
def image_env(tmp_path_factory) -> Path:
    """A fresh venv with the CPU image's packages, installed as Dockerfile.cpu installs them."""
    root = tmp_path_factory.mktemp("image")
    src = root / "src"
    shutil.copytree(
        REPO / "podserver",
        src / "podserver",
        ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info"),
    )
    shutil.copy(REPO / "constraints.txt", src / "constraints.txt")
    venv = root / "venv"
    clean = {key: value for key, value in os.environ.items() if not key.startswith(("PYTHON", "VIRTUAL_ENV"))}
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, env=clean, timeout=INSTALL_TIMEOUT)
    install = subprocess.run(
        [
            venv / "bin" / "pip",
            "install",
            "-q",
            "-c",
            src / "constraints.txt",
            f"{src / 'podserver'}[tesseract,rapidocr]",
        ],
        env=clean,
        cwd=root,
        capture_output=True,
        text=True,
        timeout=INSTALL_TIMEOUT,
    )
    assert install.returncode == 0, install.stdout[-3000:] + install.stderr[-3000:]
    shutil.rmtree(src / "podserver")  # as the image does: only the installed package remains
    return venv


def pod_env(venv: Path, **extra: str) -> dict[str, str]:
    """What a RunPod pod's environment holds, less the address: the test listens on loopback only."""
    return {
        "PATH": f"{venv / 'bin'}:/usr/bin:/bin",
        "HOME": os.environ.get("HOME", "/root"),
        "RUNPOD_POD_ID": "imagetest01",
        "HOST": "127.0.0.1",
        "PORT": "0",
        "POD_TOKEN": TOKEN,
        "LANES": "2",
        "OMP_THREAD_LIMIT": "1",
        **extra,
    }


class EntrypointPod(Pod):
    """deploy/pod/entrypoint.sh run as the image's ENTRYPOINT, from a directory outside the repo."""

    def __init__(self, env: dict[str, str], cwd: Path) -> None:
        self.log = cwd / f"pod-{env['ENGINE']}.log"
        with open(self.log, "w") as stderr:
            self.proc = subprocess.Popen(
                [str(ENTRYPOINT)], cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=stderr, text=True
            )
        self.url = self._read_listening_line()

    def wait_ready(self) -> None:
        try:
            super().wait_ready()
        except BaseException:
            self.proc.kill()
            raise AssertionError(self.log.read_text()[-3000:]) from None


@pytest.fixture
def run_image(image_env: Path, tmp_path: Path) -> Iterator:
    pods: list[EntrypointPod] = []

    def run(**extra: str) -> EntrypointPod:
        pods.append(EntrypointPod(pod_env(image_env, **extra), cwd=tmp_path))
        pods[-1].wait_ready()
        return pods[-1]

    yield run
    for pod in pods:
        if pod.proc.poll() is None:
            pod.proc.kill()
            pod.proc.wait()


def read_a_page(url: str) -> dict:
    auth = {"Authorization": f"Bearer {TOKEN}"}
    data = pdf_bytes(PAGES_TRUTH[1:2])
    name = hashlib.sha256(data).hexdigest()
    with httpx.Client(headers=auth, timeout=HANG_GUARD) as client:
        assert client.put(f"{url}/v1/documents/{name}", content=data).status_code == 201
        response = client.post(f"{url}/v1/ocr", json={"document": name, "page": 1, "dpi": 200})
        assert response.status_code == 200, response.text
        page = response.json()
        page["models"] = client.get(f"{url}/v1/models").json()
    assert httpx.get(f"{url}/v1/models").status_code == 401  # the image's server wants its token
    return page


def test_the_environment_holds_the_installed_package_not_the_repository(image_env: Path, tmp_path: Path) -> None:
    found = subprocess.run(
        [image_env / "bin" / "python", "-c", "import podserver, rapidocr, onnxruntime; print(podserver.__file__)"],
        cwd=tmp_path,
        env=pod_env(image_env),
        capture_output=True,
        text=True,
        check=True,
    )
    assert found.stdout.strip().startswith(str(image_env)), found.stdout
    assert (image_env / "bin" / "podserver").exists()  # the console script too


@pytest.mark.parametrize("engine", ["tesseract", "rapidocr"])
def test_the_entrypoint_serves_a_page_with_the_engine(run_image, engine: str) -> None:
    pod = run_image(ENGINE=engine)

    page = read_a_page(pod.url)

    assert accuracy(page["text"], " ".join(PAGES_TRUTH[1])) >= 0.95, page["text"]
    assert (page["engine"], page["models"]["engine"], page["models"]["lanes"]) == (engine, engine, 2)
    pod.proc.send_signal(signal.SIGTERM)  # exec'd: the signal reaches the pod server itself
    assert pod.proc.wait(timeout=HANG_GUARD) == 0


@pytest.fixture
def vlm_pod(run_image, image_env: Path, tmp_path: Path) -> Iterator[tuple[EntrypointPod, Path, Path]]:
    """The image's entrypoint with ENGINE=vlm, a stand-in ``vllm`` on PATH and weights on a "volume"."""
    weights = tmp_path / "volume" / "olmOCR-2-7B-1025-FP8"
    weights.mkdir(parents=True)
    calls = tmp_path / "vllm-argv"
    fake = tmp_path / "bin" / "vllm"
    fake.parent.mkdir()
    fake.write_text(
        f"#!{image_env / 'bin' / 'python'}\n"
        "import os, sys\n"
        f"open({str(calls)!r}, 'w').write(f'{{os.getpid()}} ' + ' '.join(sys.argv[1:]))\n"
        f"sys.path.insert(0, {str(REPO / 'tests' / 'podserver')!r})\n"
        "import signal, vlm_standin\n"
        "signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})\n"
        "vlm_standin.main(sys.argv)\n"
    )
    fake.chmod(0o755)
    pod = run_image(
        ENGINE="vlm",
        MODEL="allenai/olmOCR-2-7B-1025-FP8",
        MODEL_PATH=str(weights),
        VLM_PORT=str(free_port()),
        PATH=f"{fake.parent}:{image_env / 'bin'}:/usr/bin:/bin",
    )
    yield pod, weights, calls


def test_with_engine_vlm_the_entrypoint_starts_vllm_beside_the_server_and_stops_both(vlm_pod) -> None:
    pod, weights, calls = vlm_pod

    page = read_a_page(pod.url)

    vllm_pid, *argv = calls.read_text().split()
    assert argv[:2] == ["serve", str(weights)]
    assert argv[argv.index("--served-model-name") + 1] == "allenai/olmOCR-2-7B-1025-FP8"
    assert argv[argv.index("--host") + 1] == "127.0.0.1"
    assert accuracy(page["text"], " ".join(PAGES_TRUTH[1])) >= 0.95, page["text"]
    assert page["models"]["engine"] == "vlm"
    pod.proc.send_signal(signal.SIGTERM)
    assert pod.proc.wait(timeout=HANG_GUARD) == 0
    assert not Path(f"/proc/{vllm_pid}").exists()  # vLLM was stopped and reaped too


def test_when_vllm_dies_the_pod_stops_instead_of_answering_loading_forever(vlm_pod) -> None:
    pod, _, calls = vlm_pod
    vllm_pid = int(calls.read_text().split()[0])

    os.kill(vllm_pid, signal.SIGKILL)

    assert pod.proc.wait(timeout=HANG_GUARD) == 1
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{pod.url}/healthz")  # the pod server went with it
    assert "exited on its own" in pod.log.read_text()
