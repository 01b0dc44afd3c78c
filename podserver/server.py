"""HTTP front: a thread per connection, a fixed number of OCR lanes, JSON only."""

from __future__ import annotations

import json
import socket
import socketserver
import sys
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from . import DEFAULT_MAX_BYTES, engine

ROUTES = {"/healthz": "GET", "/v1/models": "GET", "/v1/ocr": "POST"}
LOADING, READY, FAILED = "loading", "ok", "failed"


class PodServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 64

    def __init__(
        self,
        host: str,
        port: int,
        lanes: int,
        page_timeout: float,
        name: str,
        max_bytes: int,
    ) -> None:
        self.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.lane_count = lanes
        # Non-blocking acquire only: a busy pod answers 429 so the dispatcher can
        # place the page elsewhere instead of it waiting in a hidden queue here.
        self.lanes = threading.BoundedSemaphore(lanes)
        self.page_timeout = page_timeout
        self.name = name
        self.max_bytes = max_bytes
        self.state = LOADING
        self.error = ""
        self.version = ""
        self.languages: list[str] = []
        self.loaded = threading.Event()  # set once loading finished, either way
        self.draining = False
        self.stats_lock = threading.Lock()
        self.busy = 0
        self.pages_done = 0
        self.pages_failed = 0
        super().__init__((host, port), PodHandler)

    def server_bind(self) -> None:
        # HTTPServer.server_bind calls socket.getfqdn(), a reverse DNS lookup that can
        # stall pod start-up for seconds; nothing here needs the FQDN.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = self.server_address[:2]

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"

    def start_loading(self) -> threading.Thread:
        thread = threading.Thread(target=self._load, name="engine-load", daemon=True)
        thread.start()
        return thread

    def _load(self) -> None:
        try:
            self.version, self.languages = engine.load()
            self.state = READY
        except Exception as exc:
            self.error = str(exc) or type(exc).__name__
            self.state = FAILED
            sys.stderr.write(f"podserver: engine failed to load: {self.error}\n")
        finally:
            self.loaded.set()

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
        # does not upload a page we are about to refuse (413, 429, ...).
        self._expect_continue = True
        return True

    def _dispatch(self, method: str) -> None:
        self._expect_continue = self._expect_continue and method == "POST"
        self._body_pending = bool(self._declared_length() or self.headers.get("Transfer-Encoding"))
        path = urlsplit(self.path).path
        allowed = ROUTES.get(path)
        try:
            if allowed is None:
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
            else:
                self._ocr()
        except (ConnectionError, TimeoutError):
            # The client went away or stalled: nobody is left to answer.
            self.close_connection = True
        except Exception as exc:
            self.log_error("unhandled error on %s %s: %r", method, path, exc)
            self._send(HTTPStatus.INTERNAL_SERVER_ERROR, {"error": f"internal error: {exc}"})
        finally:
            self._expect_continue = False

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
                "engine": engine.ENGINE,
                "version": srv.version,
                "languages": srv.languages,
                "lanes": srv.lane_count,
                "busy": busy,
                "ready": srv.state == READY,
                "name": srv.name,
                "pages_done": done,
                "pages_failed": failed,
            },
        )

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

        query = parse_qs(urlsplit(self.path).query)
        lang = query.get("lang", ["eng"])[-1]
        unknown = [part for part in lang.split("+") if part not in srv.languages]
        if unknown:
            error = f"unknown language(s) {unknown!r}; installed: {srv.languages}"
            self._send(HTTPStatus.BAD_REQUEST, {"error": error})
            return

        length = self._declared_length()
        if length is None:
            self._send(HTTPStatus.BAD_REQUEST, {"error": "missing or invalid Content-Length"})
            return
        if length == 0:
            self._send(HTTPStatus.BAD_REQUEST, {"error": "empty body"})
            return
        if length > srv.max_bytes:
            self._send(
                HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                {"error": f"body of {length} bytes exceeds limit of {srv.max_bytes}"},
            )
            return

        if not srv.lanes.acquire(blocking=False):
            self._send(
                HTTPStatus.TOO_MANY_REQUESTS,
                {"error": "all lanes busy"},
                {"Retry-After": "1"},
            )
            return
        with srv.stats_lock:
            srv.busy += 1
        try:
            status, payload = self._run_page(lang, length)
        finally:
            # Free the lane before answering: a client that sends its next page
            # as soon as it reads this answer must find the lane free.
            with srv.stats_lock:
                srv.busy -= 1
            srv.lanes.release()
        self._send(status, payload)

    def _run_page(self, lang: str, length: int) -> tuple[HTTPStatus, dict]:
        srv = self.server
        if self._expect_continue:
            self.send_response_only(HTTPStatus.CONTINUE)
            self.end_headers()
        body = self.rfile.read(length)
        self._body_pending = False
        if len(body) != length:
            self.close_connection = True
            return HTTPStatus.BAD_REQUEST, {"error": "incomplete body"}
        try:
            img = engine.decode_image(body)
        except engine.BadImage as exc:
            srv.count(ok=False)
            return HTTPStatus.BAD_REQUEST, {"error": str(exc)}
        del body  # a page can be tens of MB; do not hold it through the OCR
        try:
            result = engine.ocr_image(img, lang, srv.page_timeout)
        except engine.PageTimeout:
            srv.count(ok=False)
            return HTTPStatus.GATEWAY_TIMEOUT, {"error": f"page time limit of {srv.page_timeout:g} s exceeded"}
        except Exception as exc:
            srv.count(ok=False)
            self.log_error("engine error: %r", exc)
            return HTTPStatus.INTERNAL_SERVER_ERROR, {"error": f"engine error: {exc}"}
        srv.count(ok=True)
        return HTTPStatus.OK, result

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
        # discard what is still arriving (bounded), so the client sees the 413/429.
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
        pass  # no access log: a busy pod would flood its stderr

    def log_error(self, format: str, *args: Any) -> None:
        if format.startswith("Request timed out"):
            return  # idle keep-alive connections time out routinely
        sys.stderr.write(f"podserver {self.address_string()}: {format % args}\n")


def make_server(
    host: str = "127.0.0.1",
    port: int = 0,
    lanes: int = 1,
    page_timeout: float = 120.0,
    name: str = "",
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> PodServer:
    """Bind the socket and start loading the engine in the background."""
    server = PodServer(host, port, lanes, page_timeout, name or socket.gethostname(), max_bytes)
    server.start_loading()
    return server
