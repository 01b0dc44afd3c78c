"""Against a real `python -m podserver` subprocess."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys

import httpx
import pytest

from tests.factories import accuracy

from .conftest import HANG_GUARD, REPO, Pod
from .helpers import PAGE_LINES

# The pod server touches no database: once, on the SQLite run.
pytestmark = pytest.mark.once_sqlite


def test_recognises_rendered_page(pod: Pod, page_png: bytes) -> None:
    response = httpx.post(
        f"{pod.url}/v1/ocr",
        params={"lang": "eng"},
        content=page_png,
        headers={"Content-Type": "application/octet-stream"},
        timeout=HANG_GUARD,
    )

    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    truth = "\n".join(PAGE_LINES)
    assert accuracy(body["text"], truth) >= 0.98, body["text"]
    assert body["engine"] == "tesseract"
    assert isinstance(body["seconds"], float)
    assert 0.0 <= body["confidence"] <= 100.0
    width, height = body["width"], body["height"]
    assert len(body["lines"]) == len(PAGE_LINES)
    for line, expected in zip(body["lines"], PAGE_LINES, strict=True):
        assert accuracy(line["text"], expected) >= 0.95
        x0, y0, x1, y1 = line["bbox"]
        assert 0 <= x0 < x1 <= width
        assert 0 <= y0 < y1 <= height
        assert isinstance(line["confidence"], float)
        assert 0.0 <= line["confidence"] <= 100.0
    # Lines come back top to bottom.
    assert [line["bbox"][1] for line in body["lines"]] == sorted(line["bbox"][1] for line in body["lines"])


def test_healthz(pod: Pod) -> None:
    response = httpx.get(f"{pod.url}/healthz")
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    assert response.json() == {"status": "ok"}


def test_models(pod: Pod) -> None:
    body = httpx.get(f"{pod.url}/v1/models").json()

    # The contract's keys (notes/session5.md), plus busy lanes and the engine's model.
    assert set(body) == {
        "engine",
        "version",
        "device",
        "model",
        "languages",
        "gives",
        "lanes",
        "busy",
        "ready",
        "name",
        "pages_done",
        "pages_failed",
        "documents",
    }
    assert body["engine"] == "tesseract"
    assert body["gives"] == ["boxes", "confidence"]  # no Markdown: its text is escaped in result.md
    assert body["device"] == "cpu"
    assert set(body["documents"]) == {"count", "bytes", "capacity_bytes"}
    assert body["documents"]["capacity_bytes"] == 2 * 1024**3
    assert re.fullmatch(r"\d+\.\d+\.\d+", body["version"])
    assert "eng" in body["languages"]
    assert body["lanes"] == 2
    assert body["busy"] == 0
    assert body["ready"] is True
    assert body["name"] == "pod-under-test"
    assert isinstance(body["pages_done"], int)
    assert isinstance(body["pages_failed"], int)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signal_stops_cleanly(spawn_pod, signum: signal.Signals) -> None:
    pod = spawn_pod("--lanes", "1")
    pod.wait_ready()

    pod.proc.send_signal(signum)

    assert pod.proc.wait(timeout=HANG_GUARD) == 0


def test_signal_before_engine_is_ready_still_exits_zero(spawn_pod) -> None:
    pod = spawn_pod()  # straight after LISTENING, the engine may still be loading

    pod.proc.send_signal(signal.SIGTERM)

    assert pod.proc.wait(timeout=HANG_GUARD) == 0


def test_in_a_runpod_pod_it_listens_on_every_address_reads_its_environment_and_never_logs_the_token(
    spawn_pod, page_png: bytes, tmp_path
) -> None:
    token = "s3cret-pod-token-0d1e"
    log = tmp_path / "stderr"
    env = {"RUNPOD_POD_ID": "abc123xyz", "POD_TOKEN": token, "LANES": "3", "ENGINE": "tesseract"}
    with open(log, "w") as stderr:
        pod = spawn_pod("--name", "runpod-like", env=env, stderr=stderr)
        assert pod.url.startswith("http://0.0.0.0:")
        url = pod.url.replace("0.0.0.0", "127.0.0.1")  # this test only talks to loopback
        pod.url = url
        pod.wait_ready()
        good, bad = {"Authorization": f"Bearer {token}"}, {"Authorization": f"Bearer {token}-not"}
        models = httpx.get(f"{url}/v1/models", headers=good).json()
        answers = [
            httpx.post(f"{url}/v1/ocr", content=page_png, headers=bad),
            httpx.post(f"{url}/v1/ocr", content=b"not an image", headers=good),
            httpx.post(f"{url}/v1/ocr", json={"document": "0" * 64, "page": 1}, headers=good),
            httpx.post(f"{url}/v1/ocr", content=page_png, headers=good, timeout=HANG_GUARD),
        ]
        pod.stop()

    assert (models["lanes"], models["engine"], models["name"]) == (3, "tesseract", "runpod-like")
    assert [answer.status_code for answer in answers] == [401, 400, 409, 200]
    assert all(token not in answer.text for answer in answers)
    assert token not in log.read_text()
    assert token not in subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout


def test_a_pod_on_a_public_address_without_a_token_exits_at_once_and_says_why() -> None:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "RUNPOD_POD_ID": "abc123xyz"}
    done = subprocess.run(
        [sys.executable, "-m", "podserver", "--port", "0"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=HANG_GUARD,
    )
    assert done.returncode == 2
    assert "LISTENING" not in done.stdout
    assert "refusing to listen on 0.0.0.0 without a token" in done.stderr


def test_a_second_pod_on_the_same_cache_directory_refuses_to_start(spawn_pod, tmp_path) -> None:
    cache = str(tmp_path / "documents")
    first = spawn_pod("--cache-dir", cache)
    first.wait_ready()

    second = subprocess.run(
        [sys.executable, "-m", "podserver", "--port", "0", "--cache-dir", cache],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=HANG_GUARD,
    )

    assert second.returncode == 1
    assert "document cache of another running pod server" in second.stderr
    assert httpx.get(f"{first.url}/healthz").status_code == 200
