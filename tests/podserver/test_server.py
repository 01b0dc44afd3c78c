"""In-process servers, for behaviour a test must steer (lanes, loading, limits)."""

from __future__ import annotations

import os
import socket
import threading
import time

import httpx
import pytesseract
import pytest
from PIL import Image

from podserver.__main__ import parse_args
from podserver.engines import tesseract
from podserver.engines.base import usable_cpus
from podserver.engines.tesseract import TesseractEngine
from tests.factories import accuracy

from .conftest import HANG_GUARD
from .helpers import encode, png_header_only, render

# The pod server touches no database: once, on the SQLite run.
pytestmark = pytest.mark.once_sqlite


def models(url: str) -> dict:
    return httpx.get(f"{url}/v1/models").json()


def test_all_lanes_busy_answers_429_at_once(start_server, page_png: bytes) -> None:
    server, url = start_server(lanes=1)
    assert server.lanes.acquire(blocking=False)
    try:
        response = httpx.post(f"{url}/v1/ocr", content=page_png, timeout=HANG_GUARD)
    finally:
        server.lanes.release()

    assert response.status_code == 429
    assert response.headers["retry-after"] == "1"
    assert response.headers["content-type"] == "application/json"
    assert response.json() == {"error": "all lanes busy"}

    response = httpx.post(f"{url}/v1/ocr", content=page_png, timeout=HANG_GUARD)
    assert response.status_code == 200, response.text


def test_page_in_flight_holds_its_lane(start_server, page_png: bytes, monkeypatch) -> None:
    entered, release = threading.Event(), threading.Event()
    server, url = start_server(lanes=1)  # loaded: the start-up page went through the real engine
    real_ocr = server.engine.ocr

    def slow_ocr(img: Image.Image, lang: str, timeout: float) -> dict:
        entered.set()
        release.wait(HANG_GUARD)
        return real_ocr(img, lang, timeout)

    monkeypatch.setattr(server.engine, "ocr", slow_ocr)
    first: list[httpx.Response] = []
    worker = threading.Thread(
        target=lambda: first.append(httpx.post(f"{url}/v1/ocr", content=page_png, timeout=HANG_GUARD))
    )
    worker.start()
    try:
        assert entered.wait(HANG_GUARD)
        assert models(url)["busy"] == 1
        second = httpx.post(f"{url}/v1/ocr", content=page_png, timeout=HANG_GUARD)
        assert second.status_code == 429
    finally:
        release.set()
        worker.join(HANG_GUARD)

    assert first[0].status_code == 200
    after = models(url)
    assert after["busy"] == 0
    assert after["pages_done"] == 1


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        (b"", "empty body"),
        (b"this is not an image at all", "not an image: "),
        (encode(render(["truncated"]))[:200], "not an image: "),
    ],
    ids=["empty", "garbage", "truncated-png"],
)
def test_bad_body_is_400(start_server, content: bytes, fragment: str) -> None:
    _, url = start_server()
    response = httpx.post(f"{url}/v1/ocr", content=content)
    assert response.status_code == 400
    assert response.headers["content-type"] == "application/json"
    assert fragment in response.json()["error"]


def test_missing_content_length_is_400(start_server, page_png: bytes) -> None:
    _, url = start_server()
    # A generator body makes httpx send chunked encoding, i.e. no Content-Length.
    response = httpx.post(f"{url}/v1/ocr", content=iter([page_png]))
    assert response.status_code == 400
    assert "Content-Length" in response.json()["error"]


def test_body_over_max_bytes_is_413(start_server) -> None:
    _, url = start_server(max_bytes=1_000_000)
    response = httpx.post(f"{url}/v1/ocr", content=b"\0" * 1_000_001, timeout=HANG_GUARD)
    assert response.status_code == 413
    assert "exceeds limit" in response.json()["error"]


def test_413_is_sent_without_reading_the_body(start_server) -> None:
    _, url = start_server(max_bytes=1_000)
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=HANG_GUARD) as sock:
        # Only headers go out: the answer must come without the body ever being sent.
        sock.sendall(b"POST /v1/ocr HTTP/1.1\r\nHost: x\r\nContent-Length: 5000000\r\nExpect: 100-continue\r\n\r\n")
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
    assert reply.startswith(b"HTTP/1.1 413 ")
    assert b"100 Continue" not in reply


@pytest.mark.parametrize("lang", ["xyz", "eng+xyz", "eng+"])
def test_unknown_language_is_400(start_server, page_png: bytes, lang: str) -> None:
    _, url = start_server()
    response = httpx.post(f"{url}/v1/ocr", params={"lang": lang}, content=page_png)
    assert response.status_code == 400
    assert "unknown language" in response.json()["error"]


# Pillow only warns (not raises) just over its limit; the server rejects those itself.
@pytest.mark.filterwarnings("ignore::PIL.Image.DecompressionBombWarning")
@pytest.mark.parametrize("size", [(20_000, 20_000), (10_001, 10_000)], ids=["bomb", "just-over"])
def test_decompression_bomb_is_400(start_server, size: tuple[int, int]) -> None:
    _, url = start_server()
    response = httpx.post(f"{url}/v1/ocr", content=png_header_only(*size))
    assert response.status_code == 400
    assert "too large" in response.json()["error"]


def test_page_time_limit_is_504(start_server, page_png: bytes) -> None:
    _, url = start_server(page_timeout=0.001)
    response = httpx.post(f"{url}/v1/ocr", content=page_png, timeout=HANG_GUARD)
    assert response.status_code == 504
    assert response.json() == {"error": "page time limit of 0.001 s exceeded"}
    after = models(url)
    assert (after["pages_done"], after["pages_failed"], after["busy"]) == (0, 1, 0)


def test_engine_error_is_500_and_frees_the_lane(start_server, page_png: bytes, monkeypatch) -> None:
    def broken(*args: object, **kwargs: object) -> dict:
        raise pytesseract.TesseractError(1, "simulated crash")

    server, url = start_server(lanes=1)
    monkeypatch.setattr(pytesseract, "image_to_data", broken)  # the command, per page
    monkeypatch.setattr(tesseract._ApiPool, "read", broken)  # the C API (tesserocr)
    response = httpx.post(f"{url}/v1/ocr", content=page_png)
    assert response.status_code == 500
    assert "simulated crash" in response.json()["error"]
    assert server.lanes.acquire(blocking=False)  # released despite the failure
    server.lanes.release()


def test_unknown_path_is_404(start_server) -> None:
    _, url = start_server()
    for response in (
        httpx.get(f"{url}/nope"),
        httpx.post(f"{url}/v1/nope", content=b"x"),
    ):
        assert response.status_code == 404
        assert response.headers["content-type"] == "application/json"
        assert response.json() == {"error": "not found"}


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [
        ("GET", "/v1/ocr", "POST"),
        ("POST", "/healthz", "GET"),
        ("DELETE", "/v1/models", "GET"),
    ],
)
def test_wrong_method_is_405(start_server, method: str, path: str, allow: str) -> None:
    _, url = start_server()
    response = httpx.request(method, f"{url}{path}")
    assert response.status_code == 405
    assert response.headers["allow"] == allow
    assert "not allowed" in response.json()["error"]


def test_healthz_while_loading_then_ready(start_server, monkeypatch) -> None:
    release = threading.Event()
    real_load = TesseractEngine.load

    def slow_load(self: TesseractEngine) -> None:
        release.wait(HANG_GUARD)
        real_load(self)

    monkeypatch.setattr(TesseractEngine, "load", slow_load)
    server, url = start_server(wait=False)

    response = httpx.get(f"{url}/healthz")
    assert response.status_code == 503
    assert response.json() == {"status": "loading"}
    assert models(url)["ready"] is False
    assert httpx.post(f"{url}/v1/ocr", content=b"x").status_code == 503

    release.set()
    assert server.loaded.wait(HANG_GUARD)
    assert httpx.get(f"{url}/healthz").json() == {"status": "ok"}
    assert models(url)["ready"] is True


def test_healthz_when_engine_fails(start_server, monkeypatch) -> None:
    def failing_load(self: TesseractEngine) -> None:
        raise RuntimeError("tesseract is not installed")

    monkeypatch.setattr(TesseractEngine, "load", failing_load)
    _, url = start_server()

    response = httpx.get(f"{url}/healthz")
    assert response.status_code == 503
    assert response.json() == {
        "status": "failed",
        "error": "tesseract is not installed",
    }
    assert models(url)["ready"] is False


def test_keep_alive_connection_serves_several_pages(start_server, page_png: bytes) -> None:
    _, url = start_server()
    with httpx.Client(timeout=HANG_GUARD) as client:
        statuses = [client.post(f"{url}/v1/ocr", content=page_png).status_code for _ in range(2)]
        statuses.append(client.get(f"{url}/healthz").status_code)
    assert statuses == [200, 200, 200]


def _cmyk_jpeg(img: Image.Image) -> bytes:
    return encode(img.convert("CMYK"), "JPEG", quality=95)


def _palette_png(img: Image.Image) -> bytes:
    return encode(img.convert("RGB").convert("P", palette=Image.Palette.ADAPTIVE, colors=16))


def _transparent_png(img: Image.Image) -> bytes:
    # Black ink on a transparent background: naive flattening is black on black.
    rgba = Image.new("RGBA", img.size, (0, 0, 0, 0))
    rgba.putalpha(img.point(lambda v: 255 - v))
    return encode(rgba)


def _tiff_16bit(img: Image.Image) -> bytes:
    wide = img.convert("I").point(lambda v: v * 257).convert("I;16")
    return encode(wide, "TIFF")


def _bilevel_tiff(img: Image.Image) -> bytes:
    return encode(img.convert("1"), "TIFF", compression="group4")


@pytest.mark.parametrize(
    "encoder",
    [_cmyk_jpeg, _palette_png, _transparent_png, _tiff_16bit, _bilevel_tiff],
    ids=["cmyk-jpeg", "palette-png", "transparent-png", "16bit-tiff", "bilevel-tiff"],
)
def test_image_modes_are_converted(start_server, encoder) -> None:
    truth = "Pack my box with five dozen liquor jugs."
    _, url = start_server()
    response = httpx.post(f"{url}/v1/ocr", content=encoder(render([truth])), timeout=HANG_GUARD)
    assert response.status_code == 200, response.text
    assert accuracy(response.json()["text"], truth) >= 0.98, response.json()["text"]


@pytest.mark.parametrize(
    "args",
    [["--lanes", "0"], ["--page-timeout", "0"], ["--max-bytes", "-1"], ["--port", "70000"], ["--engine", "nope"]],
    ids=["lanes", "page-timeout", "max-bytes", "port", "engine"],
)
def test_cli_rejects_bad_arguments(args: list[str]) -> None:
    with pytest.raises(SystemExit):
        parse_args(["--port", "0", *args])


def test_cli_defaults() -> None:
    args = parse_args(["--port", "0"])
    assert (args.host, args.lanes, args.page_timeout, args.max_bytes) == (
        "127.0.0.1",
        1,
        120.0,
        50 * 1024 * 1024,
    )


def test_lanes_auto_gives_tesseract_one_lane_per_usable_cpu(start_server) -> None:
    server, url = start_server(lanes=0)
    body = models(url)
    assert body["lanes"] == usable_cpus() == server.lane_count
    assert 1 <= body["lanes"] <= len(os.sched_getaffinity(0))
    held = [server.lanes.acquire(blocking=False) for _ in range(body["lanes"])]
    assert all(held) and not server.lanes.acquire(blocking=False)  # the semaphore has that many
    for _ in held:
        server.lanes.release()


# --- connections bounded (security review L5) ------------------------------------------------------


def test_connections_past_the_bound_get_a_503_not_a_thread(start_server):
    server, url = start_server(lanes=1)
    host, port = server.server_address[:2]
    idle = [socket.create_connection((host, port), timeout=10) for _ in range(server.max_connections)]
    try:
        wait = time.monotonic() + 10
        while server.connections < server.max_connections and time.monotonic() < wait:
            time.sleep(0.01)

        refused = httpx.get(f"{url}/healthz", timeout=10)

        assert refused.status_code == 503 and "too many connections" in refused.json()["error"]
        assert refused.headers["Retry-After"] == "1" and server.connections == server.max_connections
    finally:
        for sock in idle:
            sock.close()
    wait = time.monotonic() + 10
    while server.connections and time.monotonic() < wait:
        time.sleep(0.01)
    assert httpx.get(f"{url}/healthz", timeout=10).status_code == 200


def test_connections_take_no_thread_each(start_server, page_png: bytes):
    server, url = start_server(lanes=1)
    assert httpx.post(f"{url}/v1/ocr", content=page_png, timeout=HANG_GUARD).status_code == 200  # lanes started
    threads = threading.active_count()
    host, port = server.server_address[:2]
    idle = [socket.create_connection((host, port), timeout=10) for _ in range(server.max_connections - 1)]
    try:
        wait = time.monotonic() + 10
        while server.connections < len(idle) and time.monotonic() < wait:
            time.sleep(0.01)
        assert server.connections == len(idle)
        assert threading.active_count() == threads  # one event loop serves them all
        assert httpx.get(f"{url}/healthz", timeout=10).status_code == 200
    finally:
        for sock in idle:
            sock.close()
