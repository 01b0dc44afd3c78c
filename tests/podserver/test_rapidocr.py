"""RapidOCR through the pod server, on this machine's CPU, with the PP-OCR models its wheel ships."""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterator

import httpx
import pytest

from podserver.server import make_server
from tests.factories import PAGES_TRUTH, accuracy, pdf_bytes

from .conftest import HANG_GUARD
from .helpers import PAGE_LINES

# The pod server never touches the database: one run of the suite (the embedded one) is enough.
pytestmark = pytest.mark.once_sqlite

# An environment made before rapidocr joined requirements.txt skips rather than fails to collect;
# CI cannot skip: bin/install stops when `import rapidocr, onnxruntime` fails.
onnxruntime = pytest.importorskip("onnxruntime")
rapidocr_providers = pytest.importorskip("rapidocr.inference_engine.onnxruntime.provider_config")


@pytest.fixture(scope="module")
def rapid_pod(tmp_path_factory) -> Iterator[str]:
    """One in-process pod server reading with rapidocr, shared by the module (models load once)."""
    server = make_server(engine="rapidocr", device="cpu", cache_dir=str(tmp_path_factory.mktemp("documents")))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    assert server.loaded.wait(HANG_GUARD * 3), "rapidocr never loaded"
    yield server.url
    server.shutdown()
    server.server_close()


def test_it_reports_itself_in_models(rapid_pod: str) -> None:
    body = httpx.get(f"{rapid_pod}/v1/models").json()
    assert body["ready"] is True, httpx.get(f"{rapid_pod}/healthz").text
    assert (body["engine"], body["device"]) == ("rapidocr", "cpu")
    assert body["version"].startswith("rapidocr 3.")
    assert "PP-OCR" in body["model"]
    assert {"eng", "deu", "fra"} <= set(body["languages"])


def test_it_reads_a_page_image_with_lines_boxes_and_confidence(rapid_pod: str, page_png: bytes) -> None:
    response = httpx.post(f"{rapid_pod}/v1/ocr", params={"lang": "eng"}, content=page_png, timeout=HANG_GUARD)

    assert response.status_code == 200, response.text
    body = response.json()
    assert body["engine"] == "rapidocr"
    assert accuracy(body["text"], "\n".join(PAGE_LINES)) >= 0.95, body["text"]
    assert len(body["lines"]) == len(PAGE_LINES)
    for line, expected in zip(body["lines"], PAGE_LINES, strict=True):
        assert accuracy(line["text"], expected) >= 0.95
        x0, y0, x1, y1 = line["bbox"]
        assert 0 <= x0 < x1 <= body["width"] and 0 <= y0 < y1 <= body["height"]
        assert 0.0 <= line["confidence"] <= 100.0
    assert 50.0 <= body["confidence"] <= 100.0


def test_it_reads_the_fixture_document_rendered_on_the_pod_at_95_percent(rapid_pod: str) -> None:
    data = pdf_bytes()
    name = hashlib.sha256(data).hexdigest()
    assert httpx.put(f"{rapid_pod}/v1/documents/{name}", content=data, timeout=HANG_GUARD).status_code == 201
    for number, truth in enumerate(PAGES_TRUTH, start=1):
        response = httpx.post(f"{rapid_pod}/v1/ocr", json={"document": name, "page": number}, timeout=HANG_GUARD)
        assert response.status_code == 200, response.text
        got = response.json()["text"]
        assert accuracy(got, " ".join(truth)) >= 0.95, (number, got)


def test_cuda_asked_for_on_a_machine_without_it_fails_start_up_loudly(start_server) -> None:
    server, url = start_server(engine="rapidocr", device="cuda")
    health = httpx.get(f"{url}/healthz")
    assert health.status_code == 503
    assert health.json()["status"] == "failed"
    assert "DEVICE=cuda" in health.json()["error"]
    assert httpx.get(f"{url}/v1/models").json()["ready"] is False


@pytest.mark.filterwarnings("ignore:Specified provider 'CUDAExecutionProvider':UserWarning")
def test_a_cuda_provider_that_silently_falls_back_to_the_cpu_is_refused(start_server, monkeypatch) -> None:
    # ONNX Runtime claims CUDA, but the session it makes runs on the CPU (RapidOCR#650): this CPU
    # build ignores the CUDA provider it is handed, which is exactly that fallback.
    claims = ["CUDAExecutionProvider", "CPUExecutionProvider"]
    for module in (onnxruntime, rapidocr_providers):
        monkeypatch.setattr(module, "get_available_providers", lambda: claims)
        monkeypatch.setattr(module, "get_device", lambda: "GPU")

    server, url = start_server(engine="rapidocr", device="cuda", wait=True)

    health = httpx.get(f"{url}/healthz").json()
    assert health["status"] == "failed"
    assert "refusing to run on the CPU" in health["error"]
