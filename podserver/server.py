"""HTTP front: a thread per connection, a fixed number of OCR lanes, a document cache, JSON only.

Length: one handler class holds the whole HTTP surface (auth, the four routes, the body and
connection rules that keep a refused upload from being read); split, it would read worse.
"""

from __future__ import annotations

import hmac
import json
import os
import socket
import socketserver
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from PIL import Image, ImageDraw, ImageFont

from . import engines, pages, textlayer
from .config import Config, ConfigError, is_loopback
from .config import load as load_config
from .documents import CacheFull, DocumentCache, DocumentError, valid_name
from .render import Renderer, RenderTimeout

ROUTES = {"/healthz": "GET", "/v1/models": "GET", "/v1/ocr": "POST", "/v1/documents/": "PUT"}
LOADING, READY, FAILED = "loading", "ok", "failed"
MAX_JSON_BYTES = 64 * 1024
DEFAULT_DPI = 200
WARMUP_TEXT = "fleetadmin pod ready 1234"


MIN_CONNECTIONS = 32
CONNECTIONS_PER_LANE = 4
_BUSY_BODY = b'{"error": "too many connections: try again"}'
TOO_MANY_CONNECTIONS = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\n"
    b"Connection: close\r\nContent-Length: " + str(len(_BUSY_BODY)).encode() + b"\r\n\r\n" + _BUSY_BODY
)


class PodServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 64

    def __init__(
        self, config: Config, documents: DocumentCache | None = None, environ: Mapping[str, str] | None = None
    ) -> None:
        self.config = config
        self.address_family = socket.AF_INET6 if ":" in config.host else socket.AF_INET
        # LANES=auto: 1 until the engine has loaded and chosen (no page runs before that).
        self.lane_count = config.lanes or 1
        # Non-blocking acquire only: a busy pod answers 429 so the dispatcher can
        # place the page elsewhere instead of it waiting in a hidden queue here.
        self.lanes = threading.BoundedSemaphore(self.lane_count)
        self.page_timeout = config.page_timeout
        self.name = config.name
        self.max_bytes = config.max_bytes
        self.token = config.token.encode()
        self.documents = documents or DocumentCache(config.cache_dir, config.cache_bytes)
        # PDF pages render in child processes, killed past the page's time limit (podserver/render.py).
        self.renderer = Renderer(workers=max(1, os.cpu_count() or 1))
        self.engine = engines.create(config.engine, model=config.model, device=config.device, environ=environ)
        self.state = LOADING
        self.error = ""
        self.loaded = threading.Event()  # set once loading finished, either way
        self.draining = False
        self.stats_lock = threading.Lock()
        self.busy = 0
        self.connections = 0
        self.pages_done = 0
        self.pages_failed = 0
        # When the control plane last asked for anything (a request carrying the token), on the
        # monotonic clock: the autostop watchdog stops the server once it is too long ago.
        self.last_contact = time.monotonic()
        self.autostopped = False
        super().__init__((config.host, config.port), PodHandler)

    def server_bind(self) -> None:
        # HTTPServer.server_bind calls socket.getfqdn(), a reverse DNS lookup that can
        # stall pod start-up for seconds; nothing here needs the FQDN.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = self.server_address[:2]

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"

    def server_close(self) -> None:
        super().server_close()
        self.renderer.close()

    # -- connections: a thread each, at most max_connections at once ------------------------------

    @property
    def max_connections(self) -> int:
        """Connections served at once (a thread each): room for every lane's page, a document's
        PUT and a health check per lane, and a pool's idle keep-alives; past it a connection gets
        a 503 at once, not a thread (security review L5: one per connection, unbounded)."""
        return MIN_CONNECTIONS + CONNECTIONS_PER_LANE * self.lane_count

    def process_request(self, request, client_address) -> None:
        with self.stats_lock:
            full = self.connections >= self.max_connections
            if not full:
                self.connections += 1
        if full:
            try:
                request.sendall(TOO_MANY_CONNECTIONS)
            except OSError:
                pass
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request, client_address) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self.stats_lock:
                self.connections -= 1

    def render(self, path, number: int, dpi: int) -> Image.Image:
        """A cached document's page: a PDF's within the page's time limit, an image's as it is."""
        if pages.is_pdf_file(path):
            return self.renderer.render(path, number, dpi, self.page_timeout)
        return pages.render_page(path, number, dpi)

    def start_loading(self) -> threading.Thread:
        thread = threading.Thread(target=self._load, name="engine-load", daemon=True)
        thread.start()
        return thread

    def _load(self) -> None:
        try:
            self.engine.load()
            if not self.config.lanes:
                self.lane_count = self.engine.suggested_lanes()
                self.lanes = threading.BoundedSemaphore(self.lane_count)
            self._warm_up()
            self.renderer.warm()
            self.state = READY
        except Exception as exc:
            self.error = str(exc) or type(exc).__name__
            self.state = FAILED
            sys.stderr.write(f"podserver: engine failed to load: {self.error}\n")
        finally:
            self.loaded.set()

    def _warm_up(self) -> None:
        # Ready means the engine read a real page, not only that it loaded: a pod whose
        # engine is broken (missing model, a CUDA that fails on the first kernel) must
        # never take pages. Pillow's built-in font: the image has no font files.
        font = ImageFont.load_default(size=48)
        img = Image.new("L", (int(font.getlength(WARMUP_TEXT)) + 80, 130), 255)
        ImageDraw.Draw(img).text((40, 35), WARMUP_TEXT, font=font, fill=0)
        language = "eng" if "eng" in self.engine.languages else self.engine.languages[0]
        result = self.engine.ocr(img, language, max(self.page_timeout, 120.0))
        words = set(WARMUP_TEXT.lower().split())
        if not words & set(result["text"].lower().split()):
            raise RuntimeError(f"engine read the start-up page as {result['text']!r}, not {WARMUP_TEXT!r}")

    def touch(self) -> None:
        self.last_contact = time.monotonic()

    def start_autostop(self) -> threading.Thread | None:
        """Watch for silence from the control plane; None when autostop is off."""
        if self.config.autostop <= 0:
            return None
        thread = threading.Thread(target=self._autostop_watch, name="autostop", daemon=True)
        thread.start()
        return thread

    def _autostop_watch(self) -> None:
        # Checked often enough to stop within a small fraction of the interval past it; a page in
        # flight (bounded by the page timeout) is someone talking, so the server never stops under it.
        period = min(1.0, self.config.autostop / 10)
        while True:
            time.sleep(period)
            silent = time.monotonic() - self.last_contact
            with self.stats_lock:
                busy = self.busy
            if silent >= self.config.autostop and not busy:
                break
        self.autostopped = True
        sys.stderr.write(
            f"podserver: no request from the control plane for {silent:.0f} s "
            f"(autostop {self.config.autostop:g} s): stopping\n"
        )
        self.shutdown()  # serve_forever returns in the main thread, which exits the process

    def count(self, ok: bool) -> None:
        with self.stats_lock:
            if ok:
                self.pages_done += 1
            else:
                self.pages_failed += 1


class PodHandler(BaseHTTPRequestHandler):
    server: PodServer
    protocol_version = "HTTP/1.1"  # keep-alive: the dispatcher sends page after page
    server_version = "podserver/1"
    timeout = 60  # per socket operation, so a stalled upload cannot pin a lane forever

    # True while the current request's body is unread: the connection must then
    # close (the bytes would parse as the next request) and be drained, see finish().
    _body_pending = False
    _expect_continue = False

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    def do_PATCH(self) -> None:
        self._dispatch("PATCH")

    def do_HEAD(self) -> None:
        self._dispatch("HEAD")

    def do_OPTIONS(self) -> None:
        self._dispatch("OPTIONS")

    def handle_expect_100(self) -> bool:
        # Defer "100 Continue" until the request is accepted, so a client that asked
        # does not upload a page we are about to refuse (401, 413, 429, ...).
        self._expect_continue = True
        return True

    def _dispatch(self, method: str) -> None:
        self._expect_continue = self._expect_continue and method in ("POST", "PUT")
        self._body_pending = bool(self._declared_length() or self.headers.get("Transfer-Encoding"))
        path = urlsplit(self.path).path
        route = "/v1/documents/" if path.startswith("/v1/documents/") else path
        allowed = ROUTES.get(route)
        # Anything asked with the token is the control plane speaking (an unauthenticated
        # /healthz from whoever can reach the port does not keep a pod billing).
        authorized = self._authorized()
        if authorized:
            self.server.touch()
        try:
            if path != "/healthz" and not authorized:
                # Decided from the headers alone: the body is never read, the connection closes.
                self.close_connection = True
                self._send(HTTPStatus.UNAUTHORIZED, {"error": "missing or wrong token"}, {"WWW-Authenticate": "Bearer"})
            elif allowed is None:
                self._send(HTTPStatus.NOT_FOUND, {"error": "not found"})
            elif method != allowed:
                self._send(
                    HTTPStatus.METHOD_NOT_ALLOWED,
                    {"error": f"method {method} not allowed"},
                    {"Allow": allowed},
                )
            elif path == "/healthz":
                self._healthz()
            elif path == "/v1/models":
                self._models()
            elif route == "/v1/documents/":
                self._put_document(path.removeprefix("/v1/documents/"))
            else:
                self._ocr()
        except (ConnectionError, TimeoutError):
            # The client went away or stalled: nobody is left to answer.
            self.close_connection = True
        except Exception as exc:
            self.log_error("unhandled error on %s %s: %r", method, path, exc)
            self._send(HTTPStatus.INTERNAL_SERVER_ERROR, {"error": f"internal error: {type(exc).__name__}"})
        finally:
            self._expect_continue = False
            if authorized:
                self.server.touch()  # a long page ends the silence when it is answered, not when asked

    def _authorized(self) -> bool:
        expected = self.server.token
        if not expected:
            return True  # loopback without a token: the config refuses anything else
        scheme, _, given = (self.headers.get("Authorization") or "").partition(" ")
        # compare_digest on both branches: the time taken says nothing about the token.
        return hmac.compare_digest(given.strip().encode(), expected) and scheme.lower() == "bearer"

    def _healthz(self) -> None:
        srv = self.server
        if srv.draining:
            self._send(HTTPStatus.SERVICE_UNAVAILABLE, {"status": "stopping"})
        elif srv.state == READY:
            self._send(HTTPStatus.OK, {"status": "ok"})
        elif srv.state == FAILED:
            self._send(HTTPStatus.SERVICE_UNAVAILABLE, {"status": "failed", "error": srv.error})
        else:
            self._send(HTTPStatus.SERVICE_UNAVAILABLE, {"status": "loading"})

    def _models(self) -> None:
        srv = self.server
        with srv.stats_lock:
            busy, done, failed = srv.busy, srv.pages_done, srv.pages_failed
        self._send(
            HTTPStatus.OK,
            {
                "engine": srv.engine.name,
                "version": srv.engine.version,
                "device": srv.engine.device,
                "model": srv.engine.model,
                "languages": srv.engine.languages,
                "lanes": srv.lane_count,
                "busy": busy,
                "ready": srv.state == READY,
                "name": srv.name,
                "pages_done": done,
                "pages_failed": failed,
                "documents": srv.documents.stats(),
            },
        )

    def _put_document(self, name: str) -> None:
        srv = self.server
        if not valid_name(name):
            self._send(HTTPStatus.BAD_REQUEST, {"error": "a document is named by its sha256: 64 lowercase hex digits"})
            return
        if srv.draining:
            self._send(HTTPStatus.SERVICE_UNAVAILABLE, {"error": "shutting down"})
            return
        length = self._declared_length()
        if length is None:
            self._send(HTTPStatus.BAD_REQUEST, {"error": "missing or invalid Content-Length"})
            return
        limit = min(srv.config.max_document_bytes, srv.documents.capacity_bytes)
        if length > limit:
            self._send(
                HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                {"error": f"document of {length} bytes exceeds limit of {limit}"},
            )
            return
        if length == 0:
            self._send(HTTPStatus.BAD_REQUEST, {"error": "empty body"})
            return
        with srv.documents.use(name) as held:
            if held is not None:
                # Already here: a client that asked first is spared the upload; one that sent
                # it anyway has it read and dropped, so the connection stays usable.
                path, entry = held
                if not self._expect_continue:
                    self._discard_body(length)
                if not entry.pages:  # adopted from disk at start-up: counted on first use
                    srv.documents.set_pages(name, pages.count_pages(path))
                self._send(HTTPStatus.OK, {"sha256": name, "bytes": entry.bytes, "pages": entry.pages})
                return
        self._continue()
        try:
            entry, created = srv.documents.put(name, length, self.rfile, pages.count_pages)
        except (DocumentError, pages.BadImage) as exc:
            if "incomplete body" in str(exc):
                self.close_connection = True
            self._body_pending = False
            self._send(HTTPStatus.BAD_REQUEST, {"error": str(exc)})
            return
        except CacheFull as exc:
            self._send(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, {"error": str(exc)})
            return
        self._body_pending = False
        status = HTTPStatus.CREATED if created else HTTPStatus.OK
        self._send(status, {"sha256": name, "bytes": entry.bytes, "pages": entry.pages})

    def _ocr(self) -> None:
        srv = self.server
        if srv.draining:
            self._send(HTTPStatus.SERVICE_UNAVAILABLE, {"error": "shutting down"})
            return
        if srv.state != READY:
            self._send(
                HTTPStatus.SERVICE_UNAVAILABLE,
                {"error": f"engine {srv.state}"},
                {"Retry-After": "1"} if srv.state == LOADING else None,
            )
            return
        length = self._declared_length()
        if length is None:
            self._send(HTTPStatus.BAD_REQUEST, {"error": "missing or invalid Content-Length"})
            return
        if length == 0:
            self._send(HTTPStatus.BAD_REQUEST, {"error": "empty body"})
            return
        content_type = (self.headers.get("Content-Type") or "").split(";")[0].strip().lower()
        if content_type == "application/json":
            self._ocr_document(length)
        else:
            self._ocr_image(length)

    def _ocr_document(self, length: int) -> None:
        srv = self.server
        if length > MAX_JSON_BYTES:
            self._send(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, {"error": f"JSON body over {MAX_JSON_BYTES} bytes"})
            return
        body = self._read_body(length)
        if body is None:
            return
        try:
            request = parse_page_request(body, srv.engine.languages)
        except ValueError as exc:
            self._send(HTTPStatus.BAD_REQUEST, {"error": str(exc)})
            return
        document, number, dpi, lang = request
        with srv.documents.use(document) as held:
            if held is None:
                self._send(HTTPStatus.CONFLICT, {"error": "document not cached", "document": document})
                return
            path, entry = held
            if not entry.pages:  # adopted from disk at start-up: counted on first use
                srv.documents.set_pages(document, pages.count_pages(path))
            if not 1 <= number <= entry.pages:
                self._send(
                    HTTPStatus.BAD_REQUEST,
                    {"error": f"page {number} out of range: the document has {entry.pages} pages"},
                )
                return
            # A PDF page's boxes are in its pixels at this DPI (the viewer scales them from it);
            # an image is read as it is, and DPI means nothing to it.
            pdf_dpi = dpi if pages.is_pdf_file(path) else None
            self._run_in_lane(lambda: srv.render(path, number, dpi), lang, rendered=True, dpi=pdf_dpi)

    def _ocr_image(self, length: int) -> None:
        srv = self.server
        query = parse_qs(urlsplit(self.path).query)
        lang = query.get("lang", ["eng"])[-1]
        if error := unknown_languages(lang, srv.engine.languages):
            self._send(HTTPStatus.BAD_REQUEST, {"error": error})
            return
        if length > srv.max_bytes:
            self._send(
                HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                {"error": f"body of {length} bytes exceeds limit of {srv.max_bytes}"},
            )
            return

        def decode() -> Image.Image:
            body = self._read_body(length)
            if body is None:
                raise _Answered
            return pages.decode_image(body)  # the body goes out of scope before the OCR

        self._run_in_lane(decode, lang, rendered=False)

    def _run_in_lane(
        self, make_image: Callable[[], Image.Image], lang: str, *, rendered: bool, dpi: int | None = None
    ) -> None:
        srv = self.server
        if not srv.lanes.acquire(blocking=False):
            self._send(HTTPStatus.TOO_MANY_REQUESTS, {"error": "all lanes busy"}, {"Retry-After": "1"})
            return
        with srv.stats_lock:
            srv.busy += 1
        try:
            answer = self._run_page(make_image, lang, rendered, dpi)
        finally:
            # Free the lane before answering: a client that sends its next page
            # as soon as it reads this answer must find the lane free.
            with srv.stats_lock:
                srv.busy -= 1
            srv.lanes.release()
        if answer is not None:
            self._send(*answer)

    def _run_page(
        self, make_image: Callable[[], Image.Image], lang: str, rendered: bool, dpi: int | None = None
    ) -> tuple[HTTPStatus, dict] | None:
        srv = self.server
        started = time.monotonic()
        try:
            img = make_image()
        except _Answered:
            return None
        except pages.BadImage as exc:
            srv.count(ok=False)
            return HTTPStatus.BAD_REQUEST, {"error": str(exc)}
        except RenderTimeout as exc:  # the page's fault, not the pod's: an attempt, like an OCR timeout
            srv.count(ok=False)
            return HTTPStatus.GATEWAY_TIMEOUT, {"error": str(exc)}
        render_seconds = time.monotonic() - started
        try:
            result = srv.engine.ocr(img, lang, max(0.001, srv.page_timeout - render_seconds))
        except engines.PageTimeout:
            srv.count(ok=False)
            return HTTPStatus.GATEWAY_TIMEOUT, {"error": f"page time limit of {srv.page_timeout:g} s exceeded"}
        except Exception as exc:
            srv.count(ok=False)
            self.log_error("engine error: %r", exc)
            return HTTPStatus.INTERNAL_SERVER_ERROR, {"error": f"engine error: {exc}"}
        srv.count(ok=True)
        if rendered:
            result["render_seconds"] = round(render_seconds, 3)
        if dpi is not None:
            result["dpi"] = img.info.get(pages.RENDER_DPI, dpi)
            if result["dpi"] < dpi:
                result.setdefault("warnings", []).append(
                    f"rendered at {result['dpi']} DPI, not {dpi}: at {dpi} DPI the page would be over the "
                    f"limit of {pages.MAX_PIXELS // 1_000_000} megapixels"
                )
        textlayer.mark_unusable(result, img.info.get(pages.TEXT_LAYER_PROBLEM))
        return HTTPStatus.OK, result

    def _continue(self) -> None:
        if self._expect_continue:
            self.send_response_only(HTTPStatus.CONTINUE)
            self.end_headers()
            self._expect_continue = False

    def _read_body(self, length: int) -> bytes | None:
        """The whole body, or None after answering 400 for a short one."""
        self._continue()
        body = self.rfile.read(length)
        self._body_pending = False
        if len(body) != length:
            self.close_connection = True
            self._send(HTTPStatus.BAD_REQUEST, {"error": "incomplete body"})
            return None
        return body

    def _discard_body(self, length: int) -> None:
        while length > 0:
            chunk = self.rfile.read(min(length, 1024 * 1024))
            if not chunk:
                self.close_connection = True
                break
            length -= len(chunk)
        self._body_pending = False

    def _declared_length(self) -> int | None:
        raw = self.headers.get("Content-Length")
        if raw is None or self.headers.get("Transfer-Encoding"):
            return None  # chunked uploads are not supported
        try:
            length = int(raw)
        except ValueError:
            return None
        return length if length >= 0 else None

    def _send(
        self,
        status: HTTPStatus,
        payload: dict[str, Any],
        headers: dict[str, str] | None = None,
    ) -> None:
        body = json.dumps(payload).encode()
        if self._body_pending:
            self.close_connection = True
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        # http.server answers malformed requests with HTML; keep the API all-JSON.
        self.close_connection = True
        status = HTTPStatus(code)
        self._send(status, {"error": message or status.phrase.lower()})

    def finish(self) -> None:
        super().finish()
        if self._body_pending:
            self._linger()

    def _linger(self) -> None:
        # Closing a socket with unread input makes the kernel send RST, which can
        # destroy our error response before the client reads it. Half-close and
        # discard what is still arriving (bounded), so the client sees the 401/413/429.
        deadline = time.monotonic() + 2.0
        try:
            self.connection.shutdown(socket.SHUT_WR)
            while (remaining := deadline - time.monotonic()) > 0:
                self.connection.settimeout(remaining)
                if not self.connection.recv(65536):
                    break
        except OSError:
            pass

    def version_string(self) -> str:
        return self.server_version  # no Python version in the Server header

    def log_message(self, format: str, *args: Any) -> None:
        pass  # no access log: a busy pod would flood its stderr (and headers carry the token)

    def log_error(self, format: str, *args: Any) -> None:
        if format.startswith("Request timed out"):
            return  # idle keep-alive connections time out routinely
        sys.stderr.write(f"podserver {self.address_string()}: {format % args}\n")


class _Answered(Exception):
    """The request was already answered while producing its page (a short body)."""


def unknown_languages(lang: str, installed: list[str]) -> str:
    unknown = [part for part in lang.split("+") if part not in installed]
    return f"unknown language(s) {unknown!r}; installed: {installed}" if unknown else ""


def parse_page_request(body: bytes, installed: list[str]) -> tuple[str, int, int, str]:
    """(document, page, dpi, languages) from a JSON page request; ValueError says what is wrong."""
    try:
        data = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"body is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError("body must be a JSON object")
    document = data.get("document")
    if not isinstance(document, str) or not valid_name(document):
        raise ValueError("document must be the document's sha256: 64 lowercase hex digits")
    page, dpi = data.get("page"), data.get("dpi", DEFAULT_DPI)
    if not isinstance(page, int) or isinstance(page, bool) or page < 1:
        raise ValueError("page must be an integer >= 1")
    if not isinstance(dpi, int) or isinstance(dpi, bool) or not pages.MIN_DPI <= dpi <= pages.MAX_DPI:
        raise ValueError(f"dpi must be an integer in [{pages.MIN_DPI}, {pages.MAX_DPI}]")
    lang = data.get("languages", "eng")
    if not isinstance(lang, str):
        raise ValueError("languages must be a string like 'eng+deu'")
    if error := unknown_languages(lang, installed):
        raise ValueError(error)
    return document, page, dpi, lang


def make_server(
    config: Config | None = None,
    documents: DocumentCache | None = None,
    environ: Mapping[str, str] | None = None,
    **overrides: Any,
) -> PodServer:
    """Bind the socket and start loading the engine in the background.

    Without a config, the defaults of ``python -m podserver --host 127.0.0.1 --port 0``
    (ignoring the environment), changed by ``overrides`` (lanes=2, token="...", ...).
    """
    if config is None:
        config = load_config(["--host", "127.0.0.1", "--port", "0"], environ={})
    config = replace(config, **overrides)
    if not config.token and not is_loopback(config.host):
        raise ConfigError(f"refusing to listen on {config.host} without a token")
    server = PodServer(config, documents, environ)
    server.start_loading()
    server.start_autostop()
    return server
