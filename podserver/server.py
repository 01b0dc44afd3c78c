"""HTTP front on aiohttp.web: one event loop for every connection, a fixed number of OCR lanes (a
thread each), a document cache, JSON only.

The loop only parses requests, checks them and moves bytes: a page's render and read run in the
lanes' executor (one thread per lane, never more: a page is admitted only with a free lane), a
document's write, hash and page count in a small executor of their own. So a page in flight never
holds up ``/healthz``, ``/v1/models`` or another lane's answer.

Length: one class holds the whole HTTP surface (auth, the four routes, the body and connection
rules that keep a refused upload from being read) and the server's life (load, serve, drain);
split, each part would reach into the other's state.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import os
import socket
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from http import HTTPStatus
from typing import Any

from aiohttp import web
from PIL import Image, ImageDraw, ImageFont
from pydantic import BaseModel

from . import engines, pages, textlayer
from .answers import DocumentsHeld, DocumentStored, PageAnswer, PodModels
from .config import Config, ConfigError, is_loopback
from .config import load as load_config
from .documents import CacheFull, DocumentCache, DocumentError, valid_name
from .render import Renderer, RenderTimeout

ROUTES = {"/healthz": "GET", "/v1/models": "GET", "/v1/ocr": "POST", "/v1/documents/": "PUT"}
LOADING, READY, FAILED = "loading", "ok", "failed"
MAX_JSON_BYTES = 64 * 1024
DEFAULT_DPI = 200
WARMUP_TEXT = "fleetadmin pod ready 1234"
SERVER_HEADER = "podserver/1"  # no Python or aiohttp version in the Server header

MIN_CONNECTIONS = 32
CONNECTIONS_PER_LANE = 4
# A connection idle this long (no request begun, or a body stalled between two reads) is closed:
# a stalled upload cannot pin a lane or a connection slot forever.
IDLE_SECONDS = 60.0
# After answering a request whose body it did not read (401, 413, 429, ...), what is still
# arriving is read and dropped this long before the connection closes: closed with unread input,
# the kernel sends RST, which can destroy the answer before the client reads it.
LINGER_SECONDS = 2.0
# Documents' writes, hashes and page counts: off the loop, apart from the lanes.
FILE_WORKERS = 4
_BUSY_BODY = b'{"error": "too many connections: try again"}'
TOO_MANY_CONNECTIONS = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\n"
    b"Connection: close\r\nContent-Length: " + str(len(_BUSY_BODY)).encode() + b"\r\n\r\n" + _BUSY_BODY
)
_JSON = "application/json"


class PodServer:
    def __init__(
        self, config: Config, documents: DocumentCache | None = None, environ: Mapping[str, str] | None = None
    ) -> None:
        self.config = config
        # LANES=auto: 1 until the engine has loaded and chosen (no page runs before that).
        self.lane_count = config.lanes or 1
        # Non-blocking acquire only: a busy pod answers 429 so the dispatcher can
        # place the page elsewhere instead of it waiting in a hidden queue here.
        self.lanes = threading.BoundedSemaphore(self.lane_count)
        self.lane_pool = ThreadPoolExecutor(self.lane_count, thread_name_prefix="pod-lane")
        self.file_pool = ThreadPoolExecutor(FILE_WORKERS, thread_name_prefix="pod-files")
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
        self.busy = 0
        self.connections = 0
        self.pages_done = 0
        self.pages_failed = 0
        # When the control plane last asked for anything (a request carrying the token), on the
        # monotonic clock: the autostop watch stops the server once it is too long ago.
        self.last_contact = time.monotonic()
        self.autostopped = False
        # Bound here, served by serve_forever(): the address is known (and taken) at once.
        family = socket.AF_INET6 if ":" in config.host else socket.AF_INET
        self.socket = socket.socket(family, socket.SOCK_STREAM)
        try:
            self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.socket.bind((config.host, config.port))
            self.socket.listen(64)
        except OSError:
            self.socket.close()
            raise
        self.server_address = self.socket.getsockname()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._stop_asked = False
        self._life = threading.Lock()
        self._served = threading.Event()  # serve_forever() has returned
        self._idle: asyncio.Event | None = None  # while draining: set once no page is in flight

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"

    @property
    def max_connections(self) -> int:
        """Connections served at once: room for every lane's page, a document's PUT and a health
        check per lane, and a pool's idle keep-alives; past it a connection gets a 503 at once
        (security review L5)."""
        return MIN_CONNECTIONS + CONNECTIONS_PER_LANE * self.lane_count

    # -- life: load, serve, stop ------------------------------------------------------------------

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
                self.lane_pool = ThreadPoolExecutor(self.lane_count, thread_name_prefix="pod-lane")
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

    def serve_forever(self) -> None:
        """Serve until shutdown() (or autostop); then drain: no new connection, the pages in flight
        answered (within the page timeout), the connections closed."""
        try:
            asyncio.run(self._serve())
        finally:
            self._served.set()

    def shutdown(self) -> None:
        """Stop serve_forever() from another thread, and wait until it has returned."""
        with self._life:
            self._stop_asked = True
            loop, stop = self._loop, self._stop
        if loop is not None and stop is not None:
            try:
                loop.call_soon_threadsafe(stop.set)
            except RuntimeError:
                pass  # the loop has closed already
        self._served.wait()

    def server_close(self) -> None:
        self.socket.close()
        self.renderer.close()
        self.lane_pool.shutdown(wait=False)
        self.file_pool.shutdown(wait=False)

    async def _serve(self) -> None:
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        with self._life:
            self._loop, self._stop = loop, stop
            if self._stop_asked:
                stop.set()
        app = web.Application()
        # One route for every path and method: the token is checked, from the headers alone, before
        # anything else (an unknown path without it is a 401 too), and no "100 Continue" goes out
        # until a request is accepted (aiohttp's default expect handler would send it at once).
        app.router.add_route("*", "/{path:.*}", self._handle, expect_handler=_no_continue)
        runner = web.AppRunner(
            app, handle_signals=False, access_log=None,  # no access log: headers carry the token
            keepalive_timeout=IDLE_SECONDS, lingering_time=LINGER_SECONDS, shutdown_timeout=LINGER_SECONDS,
        )  # fmt: skip
        await runner.setup()
        make_handler = runner.server
        assert make_handler is not None
        listener = await loop.create_server(lambda: _Counted(self, make_handler), sock=self.socket)
        watch = asyncio.create_task(self._autostop()) if self.config.autostop > 0 else None
        try:
            await stop.wait()
        finally:
            self.draining = True
            listener.close()  # refuse new connections while in-flight pages finish
            if watch is not None:
                watch.cancel()
            await self._drain(self.page_timeout + 5)
            await runner.cleanup()

    async def _drain(self, budget: float) -> None:
        # A page in flight is bounded by the page timeout, so finishing it beats making
        # the dispatcher redo it; past the budget we exit anyway.
        self._idle = asyncio.Event()
        if not self.busy:
            return
        try:
            await asyncio.wait_for(self._idle.wait(), budget)
        except TimeoutError:
            sys.stderr.write("podserver: exiting with pages still in flight\n")

    async def _autostop(self) -> None:
        # Checked often enough to stop within a small fraction of the interval past it; a page in
        # flight (bounded by the page timeout) is someone talking, so the server never stops under it.
        period = min(1.0, self.config.autostop / 10)
        while True:
            await asyncio.sleep(period)
            silent = time.monotonic() - self.last_contact
            if silent >= self.config.autostop and not self.busy:
                break
        self.autostopped = True
        sys.stderr.write(
            f"podserver: no request from the control plane for {silent:.0f} s "
            f"(autostop {self.config.autostop:g} s): stopping\n"
        )
        assert self._stop is not None
        self._stop.set()  # serve_forever returns in the main thread, which exits the process

    def touch(self) -> None:
        self.last_contact = time.monotonic()

    def count(self, ok: bool) -> None:
        if ok:
            self.pages_done += 1
        else:
            self.pages_failed += 1

    # -- requests -----------------------------------------------------------------------------------

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        path = request.path
        route = "/v1/documents/" if path.startswith("/v1/documents/") else path
        allowed = ROUTES.get(route)
        # Anything asked with the token is the control plane speaking (an unauthenticated
        # /healthz from whoever can reach the port does not keep a pod billing).
        authorized = self._authorized(request)
        if authorized:
            self.touch()
        try:
            if path != "/healthz" and not authorized:
                # Decided from the headers alone: the body is never read, the connection closes.
                answer = _json(HTTPStatus.UNAUTHORIZED, {"error": "missing or wrong token"},
                               {"WWW-Authenticate": "Bearer"})  # fmt: skip
                answer.force_close()
                return answer
            if allowed is None:
                return _unread(request, _json(HTTPStatus.NOT_FOUND, {"error": "not found"}))
            if request.method != allowed:
                answer = _json(HTTPStatus.METHOD_NOT_ALLOWED, {"error": f"method {request.method} not allowed"},
                               {"Allow": allowed})  # fmt: skip
                return _unread(request, answer)
            if path == "/healthz":
                return self._healthz()
            if path == "/v1/models":
                return self._models()
            if route == "/v1/documents/":
                return _unread(request, await self._put_document(request, path.removeprefix("/v1/documents/")))
            return _unread(request, await self._ocr(request))
        except (ConnectionError, TimeoutError):
            # The client went away or stalled: nobody is left to answer.
            answer = _json(HTTPStatus.BAD_REQUEST, {"error": "incomplete body"})
            answer.force_close()
            return answer
        except Exception as exc:
            sys.stderr.write(f"podserver: unhandled error on {request.method} {path}: {exc!r}\n")
            answer = _json(HTTPStatus.INTERNAL_SERVER_ERROR, {"error": f"internal error: {type(exc).__name__}"})
            return _unread(request, answer)
        finally:
            if authorized:
                self.touch()  # a long page ends the silence when it is answered, not when asked

    def _authorized(self, request: web.Request) -> bool:
        expected = self.token
        if not expected:
            return True  # loopback without a token: the config refuses anything else
        scheme, _, given = (request.headers.get("Authorization") or "").partition(" ")
        # compare_digest on both branches: the time taken says nothing about the token.
        return hmac.compare_digest(given.strip().encode(), expected) and scheme.lower() == "bearer"

    def _healthz(self) -> web.Response:
        if self.draining:
            return _json(HTTPStatus.SERVICE_UNAVAILABLE, {"status": "stopping"})
        if self.state == READY:
            return _json(HTTPStatus.OK, {"status": "ok"})
        if self.state == FAILED:
            return _json(HTTPStatus.SERVICE_UNAVAILABLE, {"status": "failed", "error": self.error})
        return _json(HTTPStatus.SERVICE_UNAVAILABLE, {"status": "loading"})

    def _models(self) -> web.Response:
        engine = self.engine
        models = PodModels(
            engine=engine.name,
            version=engine.version,
            device=engine.device,
            model=engine.model,
            languages=engine.languages,
            gives=engine.gives(),
            lanes=self.lane_count,
            busy=self.busy,
            ready=self.state == READY,
            name=self.name,
            pages_done=self.pages_done,
            pages_failed=self.pages_failed,
            documents=DocumentsHeld(**self.documents.stats()),
        )
        return _json(HTTPStatus.OK, models)

    async def _put_document(self, request: web.Request, name: str) -> web.Response:
        if not valid_name(name):
            return _json(
                HTTPStatus.BAD_REQUEST, {"error": "a document is named by its sha256: 64 lowercase hex digits"}
            )
        if self.draining:
            return _json(HTTPStatus.SERVICE_UNAVAILABLE, {"error": "shutting down"})
        length = _declared_length(request)
        if length is None:
            return _json(HTTPStatus.BAD_REQUEST, {"error": "missing or invalid Content-Length"})
        limit = min(self.config.max_document_bytes, self.documents.capacity_bytes)
        if length > limit:
            return _json(HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                         {"error": f"document of {length} bytes exceeds limit of {limit}"})  # fmt: skip
        if length == 0:
            return _json(HTTPStatus.BAD_REQUEST, {"error": "empty body"})
        loop = asyncio.get_running_loop()
        with self.documents.use(name) as held:
            if held is not None:
                # Already here: a client that asked first is spared the upload; one that sent
                # it anyway has it read and dropped, so the connection stays usable.
                path, entry = held
                if not _wants_continue(request):
                    await _discard(request)
                if not entry.pages:  # adopted from disk at start-up: counted on first use
                    counted = await loop.run_in_executor(self.file_pool, pages.count_pages, path)
                    self.documents.set_pages(name, counted)
                return _json(HTTPStatus.OK, DocumentStored(sha256=name, bytes=entry.bytes, pages=entry.pages))
        await _continue(request)
        body = _BodyReader(request, loop)
        try:
            entry, created = await loop.run_in_executor(
                self.file_pool, self.documents.put, name, length, body, pages.count_pages
            )
        except (DocumentError, pages.BadImage) as exc:
            return _json(HTTPStatus.BAD_REQUEST, {"error": str(exc)})
        except CacheFull as exc:
            return _json(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, {"error": str(exc)})
        status = HTTPStatus.CREATED if created else HTTPStatus.OK
        return _json(status, DocumentStored(sha256=name, bytes=entry.bytes, pages=entry.pages))

    async def _ocr(self, request: web.Request) -> web.Response:
        if self.draining:
            return _json(HTTPStatus.SERVICE_UNAVAILABLE, {"error": "shutting down"})
        if self.state != READY:
            return _json(HTTPStatus.SERVICE_UNAVAILABLE, {"error": f"engine {self.state}"},
                         {"Retry-After": "1"} if self.state == LOADING else None)  # fmt: skip
        length = _declared_length(request)
        if length is None:
            return _json(HTTPStatus.BAD_REQUEST, {"error": "missing or invalid Content-Length"})
        if length == 0:
            return _json(HTTPStatus.BAD_REQUEST, {"error": "empty body"})
        if request.content_type == _JSON:
            return await self._ocr_document(request, length)
        return await self._ocr_image(request, length)

    async def _ocr_document(self, request: web.Request, length: int) -> web.Response:
        if length > MAX_JSON_BYTES:
            return _json(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, {"error": f"JSON body over {MAX_JSON_BYTES} bytes"})
        body = await _read_body(request, length)
        if body is None:
            return _incomplete()
        try:
            document, number, dpi, lang = parse_page_request(body, self.engine.languages)
        except ValueError as exc:
            return _json(HTTPStatus.BAD_REQUEST, {"error": str(exc)})
        with self.documents.use(document) as held:
            if held is None:
                return _json(HTTPStatus.CONFLICT, {"error": "document not cached", "document": document})
            path, entry = held
            if not entry.pages:  # adopted from disk at start-up: counted on first use
                counted = await asyncio.get_running_loop().run_in_executor(self.file_pool, pages.count_pages, path)
                self.documents.set_pages(document, counted)
            if not 1 <= number <= entry.pages:
                return _json(HTTPStatus.BAD_REQUEST,
                             {"error": f"page {number} out of range: the document has {entry.pages} pages"})  # fmt: skip

            async def page() -> Callable[[], tuple[HTTPStatus, PageAnswer | dict]]:
                return lambda: self.read_page(lambda: self.render(path, number, dpi), lang, dpi=dpi)

            return await self._in_lane(page)

    async def _ocr_image(self, request: web.Request, length: int) -> web.Response:
        lang = request.query.getall("lang", ["eng"])[-1]
        if error := unknown_languages(lang, self.engine.languages):
            return _json(HTTPStatus.BAD_REQUEST, {"error": error})
        if length > self.max_bytes:
            return _json(HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                         {"error": f"body of {length} bytes exceeds limit of {self.max_bytes}"})  # fmt: skip

        async def page() -> Callable[[], tuple[HTTPStatus, PageAnswer | dict]] | web.Response:
            body = await _read_body(request, length)  # in the lane: a busy pod never reads it
            if body is None:
                return _incomplete()
            return lambda: self.read_page(lambda: pages.decode_image(body), lang)

        return await self._in_lane(page)

    async def _in_lane(
        self, prepare: Callable[[], Awaitable[Callable[[], tuple[HTTPStatus, PageAnswer | dict]] | web.Response]]
    ) -> web.Response:
        """A free lane or 429 at once; then the page made and read in the lane's thread."""
        if not self.lanes.acquire(blocking=False):
            return _json(HTTPStatus.TOO_MANY_REQUESTS, {"error": "all lanes busy"}, {"Retry-After": "1"})
        self.busy += 1
        try:
            job = await prepare()
            if isinstance(job, web.Response):
                return job
            status, payload = await asyncio.get_running_loop().run_in_executor(self.lane_pool, job)
        finally:
            # Free the lane before answering: a client that sends its next page
            # as soon as it reads this answer must find the lane free.
            self.busy -= 1
            self.lanes.release()
            if not self.busy and self._idle is not None:
                self._idle.set()  # a drain waits for it
        self.count(ok=status == HTTPStatus.OK)
        return _json(status, payload)

    def render(self, path, number: int, dpi: int) -> Image.Image:
        """A cached document's page: a PDF's within the page's time limit, an image's as it is."""
        if pages.is_pdf_file(path):
            return self.renderer.render(path, number, dpi, self.page_timeout)
        return pages.render_page(path, number, dpi)

    def read_page(
        self, make_image: Callable[[], Image.Image], lang: str, dpi: int | None = None
    ) -> tuple[HTTPStatus, PageAnswer | dict]:
        """In a lane's thread: the page made (rendered at ``dpi``, or decoded) and read; the answer
        (an error's: a dict)."""
        started = time.monotonic()
        try:
            img = make_image()
        except pages.BadImage as exc:
            return HTTPStatus.BAD_REQUEST, {"error": str(exc)}
        except RenderTimeout as exc:  # the page's fault, not the pod's: an attempt, like an OCR timeout
            return HTTPStatus.GATEWAY_TIMEOUT, {"error": str(exc)}
        render_seconds = time.monotonic() - started
        try:
            result = self.engine.ocr(img, lang, max(0.001, self.page_timeout - render_seconds))
            if dpi is not None:
                result["render_seconds"] = round(render_seconds, 3)
            # A PDF page's boxes are in its pixels at the DPI it was rendered at (the viewer scales
            # them from it); an image is read as it is, and DPI means nothing to it.
            if dpi is not None and pages.RENDER_DPI in img.info:
                result["dpi"] = img.info[pages.RENDER_DPI]
                if result["dpi"] < dpi:
                    result.setdefault("warnings", []).append(
                        f"rendered at {result['dpi']} DPI, not {dpi}: at {dpi} DPI the page would be over "
                        f"the limit of {pages.MAX_PIXELS // 1_000_000} megapixels"
                    )
            textlayer.mark_unusable(result, img.info.get(pages.TEXT_LAYER_PROBLEM))
            answer = PageAnswer.model_validate(result)  # an engine's answer that is not one is its error
        except engines.PageTimeout:
            return HTTPStatus.GATEWAY_TIMEOUT, {"error": f"page time limit of {self.page_timeout:g} s exceeded"}
        except Exception as exc:
            sys.stderr.write(f"podserver: engine error: {exc!r}\n")
            return HTTPStatus.INTERNAL_SERVER_ERROR, {"error": f"engine error: {exc}"}
        return HTTPStatus.OK, answer


class _Counted(asyncio.Protocol):
    """A connection: aiohttp's own protocol behind a count, at most ``max_connections`` at once;
    past it a 503 at once, and nothing of the request is read (security review L5)."""

    def __init__(self, server: PodServer, make_handler: Callable[[], asyncio.Protocol]) -> None:
        self.server = server
        self.make_handler = make_handler
        self.inner: asyncio.Protocol | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        if self.server.connections >= self.server.max_connections:
            transport.write(TOO_MANY_CONNECTIONS)
            # Half-closed, then closed once the client has read the answer (or at the linger's end).
            if transport.can_write_eof():
                transport.write_eof()
            asyncio.get_running_loop().call_later(LINGER_SECONDS, transport.close)
            return
        self.server.connections += 1
        self.inner = self.make_handler()
        self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self.inner is not None:
            self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received() if self.inner is not None else None

    def connection_lost(self, exc: Exception | None) -> None:
        if self.inner is not None:
            self.server.connections -= 1
            self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        if self.inner is not None:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        if self.inner is not None:
            self.inner.resume_writing()


class _BodyReader:
    """A request's body as the blocking file the document cache reads (in the files' executor),
    each read done on the loop within IDLE_SECONDS; a stalled or broken body reads as its end."""

    def __init__(self, request: web.Request, loop: asyncio.AbstractEventLoop) -> None:
        self.content = request.content
        self.loop = loop

    def read(self, size: int) -> bytes:
        reading = asyncio.run_coroutine_threadsafe(asyncio.wait_for(self.content.read(size), IDLE_SECONDS), self.loop)
        try:
            return reading.result()
        except Exception:
            return b""  # DocumentCache.put: "incomplete body"


async def _no_continue(request: web.Request) -> None:
    """No "100 Continue" before the request is accepted: _continue() sends it then."""


def _wants_continue(request: web.Request) -> bool:
    return request.version >= (1, 1) and request.headers.get("Expect", "").lower() == "100-continue"


async def _continue(request: web.Request) -> None:
    if _wants_continue(request) and request.method in ("POST", "PUT"):
        await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")


async def _read_body(request: web.Request, length: int) -> bytes | None:
    """The whole body (each read within IDLE_SECONDS), or None when it is short."""
    await _continue(request)
    body = bytearray()
    while len(body) < length:
        chunk = await asyncio.wait_for(request.content.read(length - len(body)), IDLE_SECONDS)
        if not chunk:
            return None
        body += chunk
    return bytes(body)


async def _discard(request: web.Request) -> None:
    while await asyncio.wait_for(request.content.read(1024 * 1024), IDLE_SECONDS):
        pass


def _declared_length(request: web.Request) -> int | None:
    raw = request.headers.get("Content-Length")
    if raw is None or request.headers.get("Transfer-Encoding"):
        return None  # chunked uploads are not supported
    try:
        length = int(raw)
    except ValueError:
        return None
    return length if length >= 0 else None


def _json(
    status: HTTPStatus, payload: BaseModel | dict[str, Any], headers: dict[str, str] | None = None
) -> web.Response:
    # A typed answer (podserver/answers.py) as it was built: the fields it was given, no others.
    body = payload.model_dump_json(exclude_unset=True) if isinstance(payload, BaseModel) else json.dumps(payload)
    answer = web.Response(status=status, body=body.encode(), content_type=_JSON, headers=headers)
    answer.headers["Server"] = SERVER_HEADER
    return answer


def _incomplete() -> web.Response:
    answer = _json(HTTPStatus.BAD_REQUEST, {"error": "incomplete body"})
    answer.force_close()
    return answer


def _unread(request: web.Request, answer: web.Response) -> web.Response:
    """An answer to a request whose body was not read whole: the connection closes after it (the
    bytes still coming would otherwise parse as the next request's)."""
    if request.body_exists and not request.content.is_eof():
        answer.force_close()
    return answer


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
    """Bind the socket and start loading the engine in the background; serve_forever() serves.

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
    return server
