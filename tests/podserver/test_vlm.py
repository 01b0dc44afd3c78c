"""The vlm engine against a stand-in for vLLM (tests/podserver/vlm_standin.py).

These tests check the adapter, not the model: that the pod asks with olmOCR's own prompt and
the page as a PNG data URL of olmOCR's size, asks for logprobs, parses olmOCR's front matter
answer into text and a confidence, turns a page the model calls rotated, and fails clearly.
No olmOCR weights run here; on a GPU pod the same code talks to the real vLLM.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from podserver.engines.vlm import OLMOCR_PROMPT, split_front_matter, token_confidence
from tests.factories import accuracy

from .conftest import HANG_GUARD
from .helpers import PAGE_LINES
from .vlm_standin import MODEL, StandIn

# The pod server touches no database: once, on the SQLite run.
pytestmark = pytest.mark.once_sqlite


@pytest.fixture
def standin() -> Iterator[StandIn]:
    server = StandIn()
    yield server
    server.stop()


@pytest.fixture
def vlm_pod(start_server, standin: StandIn) -> tuple[object, str]:
    server, url = start_server(engine="vlm", environ={"VLM_URL": standin.url})
    assert httpx.get(f"{url}/healthz").json() == {"status": "ok"}
    return server, url


def test_it_sends_olmocrs_prompt_and_the_page_and_returns_the_text(vlm_pod, standin: StandIn, page_png: bytes) -> None:
    _, url = vlm_pod
    response = httpx.post(f"{url}/v1/ocr", content=page_png, timeout=HANG_GUARD)

    assert response.status_code == 200, response.text
    body = response.json()
    assert accuracy(body["text"], "\n".join(PAGE_LINES)) >= 0.95, body["text"]
    assert "---" not in body["text"] and "primary_language" not in body["text"]
    assert body["engine"] == "vlm"
    assert body["markdown"] is True  # what the control plane shows as Markdown, never by the name
    assert body["language"] == "en"
    assert body["confidence"] == pytest.approx(90.0)  # the text's tokens only, not the certain front matter
    assert [line["text"] for line in body["lines"]] == body["text"].splitlines()

    request = standin.requests[-1]
    assert request["model"] == MODEL
    assert request["logprobs"] is True
    assert request["temperature"] == 0.1
    assert request["max_tokens"] == 8000
    text_part, image_part = request["messages"][0]["content"]
    assert text_part == {"type": "text", "text": OLMOCR_PROMPT}
    assert image_part["image_url"]["url"].startswith("data:image/png;base64,")
    assert max(standin.images[-1].size) == 1288  # olmOCR's target longest side


def test_models_reports_the_vlm(vlm_pod) -> None:
    _, url = vlm_pod
    body = httpx.get(f"{url}/v1/models").json()
    assert (body["engine"], body["model"], body["device"], body["version"]) == (
        "vlm",
        MODEL,
        "cuda",
        "vllm 0.0-standin",
    )
    assert body["gives"] == ["markdown"]  # no boxes, the page's confidence on each line


def test_a_page_the_model_calls_rotated_is_turned_and_read_again(vlm_pod, standin: StandIn, page_png: bytes) -> None:
    _, url = vlm_pod
    standin.scripted.append(
        {
            "front": "primary_language: en\nis_rotation_valid: False\nrotation_correction: 90\nis_table: False\nis_diagram: False"
        }
    )
    before = len(standin.images)

    response = httpx.post(f"{url}/v1/ocr", content=page_png, timeout=HANG_GUARD)

    assert response.status_code == 200
    first, second = standin.images[before:]
    assert second.size == (first.height, first.width)
    assert accuracy(response.json()["text"], "\n".join(PAGE_LINES)) >= 0.95


def test_an_answer_cut_at_the_token_limit_is_an_engine_error(vlm_pod, standin: StandIn, page_png: bytes) -> None:
    _, url = vlm_pod
    standin.scripted.append({"front": "primary_language: en", "text": "The quick brown", "finish": "length"})
    response = httpx.post(f"{url}/v1/ocr", content=page_png, timeout=HANG_GUARD)
    assert response.status_code == 500
    assert "cut at 8000 tokens" in response.json()["error"]


def test_a_server_that_does_not_serve_the_model_keeps_the_pod_unready(start_server) -> None:
    other = StandIn(model="someone/else")
    try:
        _, url = start_server(engine="vlm", environ={"VLM_URL": other.url})
        health = httpx.get(f"{url}/healthz").json()
    finally:
        other.stop()
    assert health["status"] == "failed"
    assert "not allenai/olmOCR-2-7B-1025-FP8" in health["error"]


def test_no_vlm_server_keeps_the_pod_unready_with_the_reason(start_server) -> None:
    gone = StandIn()
    address = gone.url
    gone.stop()
    _, url = start_server(engine="vlm", environ={"VLM_URL": address, "VLM_START_TIMEOUT": "1"})
    health = httpx.get(f"{url}/healthz").json()
    assert health["status"] == "failed"
    assert "did not answer" in health["error"]


def test_front_matter_parsing() -> None:
    content = "---\nprimary_language: de\nis_rotation_valid: true\nrotation_correction: 0\nis_table: False\n---\nHallo Welt\n\nZweiter Absatz"
    front, text, starts = split_front_matter(content)
    assert front == {"primary_language": "de", "is_rotation_valid": True, "rotation_correction": 0, "is_table": False}
    assert text == "Hallo Welt\n\nZweiter Absatz"
    assert content[starts:] == text
    assert split_front_matter("plain text, no front matter") == ({}, "plain text, no front matter", 0)
    assert split_front_matter("---\nprimary_language: null\n---\n")[:2] == ({"primary_language": None}, "")


def test_token_confidence_counts_only_the_texts_tokens() -> None:
    tokens = [{"token": "---\n", "logprob": -5.0}, {"token": "ab", "logprob": 0.0}, {"token": "cd", "logprob": -0.6931}]
    assert token_confidence(tokens, text_starts=4) == pytest.approx(75.0, abs=0.01)
    assert token_confidence([], text_starts=0) == 0.0


def test_lanes_auto_without_a_gpu_to_measure_starts_at_16(start_server, standin: StandIn) -> None:
    _, url = start_server(engine="vlm", lanes=0, environ={"VLM_URL": standin.url})
    assert httpx.get(f"{url}/v1/models").json()["lanes"] == 16
