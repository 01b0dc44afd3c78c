"""Against a real `python -m podserver` subprocess."""

from __future__ import annotations

import re
import signal

import httpx
import pytest

from .conftest import HANG_GUARD, Pod
from .helpers import PAGE_LINES, accuracy


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

    assert set(body) == {
        "engine",
        "version",
        "languages",
        "lanes",
        "busy",
        "ready",
        "name",
        "pages_done",
        "pages_failed",
    }
    assert body["engine"] == "tesseract"
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
