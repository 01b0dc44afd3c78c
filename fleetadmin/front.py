"""The front's server: daphne, with what stock daphne and Twisted get wrong for uploads put right
through their public hooks. Started as ``python -m fleetadmin.front`` with daphne's own arguments
(``-b 0.0.0.0 -p 8000 fleetadmin.asgi:application``).

Out of the box a multipart POST body is held whole in memory twice over: Twisted parses it into
``request.args`` (``content.read()``, then the email package), which daphne never reads, and
daphne reads the body back and queues every chunk of it to the application at once. Here:
- ``FrontRequest`` is built with Twisted's public ``parsePOSTFormSubmission=False``: no first
  parse (it would be ~80% of the front's CPU on uploads);
- a multipart form body of a stated length (what every upload is) is read as it arrives
  (``FrontRequest.form_for_body``, fleetadmin/formdata.py): each file is written to a temporary
  file of its own and hashed on the way, and no file holds the whole body. Twisted's temporary
  file of the body, which Django's parser read back and wrote out again file by file, was most
  of what doubled the front's CPU a page after 8db2974 (bench/uploads.py, 2,500 pages: 2.4-2.7 s
  before, 3.0-3.1 s once Django's parser read bodies at eadcdb3, 3.8-4.1 s once they went to
  that file at f74ac5a);
- ``FrontServer.create_application`` hands the body (that form, or Twisted's content file: a
  BytesIO under 100 kB, else a temporary file) to Django in the request's scope
  (``BODY_EXTENSION``), left at its end so that daphne queues one empty message; fleetadmin.asgi's
  handler reads it as the body file (a form's fields and files through ocrjobs.uploads' handler);
- a body over OCR_MAX_REQUEST_BYTES gets a 413 as soon as its Content-Length says so, before a
  byte of it is stored, and a chunked one once it passes the limit; the rest of it is dropped;
- a client cannot hold the front's capacity by being slow or many (``FrontHTTPChannel``, checked
  once a second): a request's headers must arrive within FRONT_HEADER_TIMEOUT_SECONDS of the
  connection or of the previous answer (an idle keep-alive connection ends then too), a body must
  keep up FRONT_BODY_MIN_BYTES_PER_SECOND after FRONT_BODY_GRACE_SECONDS, and arrive whole within
  FRONT_SMALL_BODY_SECONDS (a small one) or FRONT_BODY_DEADLINE_SECONDS (an upload), else a 408;
- no one takes more than their share of the bodies in flight (issue 38, N1: 64 unauthenticated
  connections announcing 2 GB and trickling 10 kB/s held every slot, and every login got a 503).
  Before a byte of a body is read: a body over FRONT_SMALL_BODY_BYTES is taken only by an upload
  path (UPLOAD_URL_NAMES) from a token that may submit or a logged-in session, checked on a thread
  (``check_uploader``) while the connection is paused (a 413 elsewhere, a 401 without them); a
  client address (the proxy's header with --proxy-headers) has at most FRONT_MAX_BODIES_PER_CLIENT
  bodies in flight and a user FRONT_MAX_UPLOADS_PER_USER uploads (else a 429 with Retry-After);
  small bodies and uploads have budgets of their own, FRONT_MAX_SMALL_BODIES_IN_FLIGHT and
  FRONT_MAX_BODIES_IN_FLIGHT, so that a login never waits behind uploads (past a budget, the
  slowest body of it that has been behind the minimum rate for EVICTABLE_AFTER_SECONDS gets a 408
  and its place goes to the new one; if none is behind, the new one gets a 503 with Retry-After).
  Refusals are JSON on the API's paths and a plain page on the others. Twisted keeps a body under
  100 kB in memory and a larger or chunked one in a temporary file, and a form keeps at most
  100 kB of fields in memory (formdata.FIELDS_IN_MEMORY_BYTES), so bodies hold at most about
  64 kB x FRONT_MAX_SMALL_BODIES_IN_FLIGHT + (100 + 256) kB x FRONT_MAX_BODIES_IN_FLIGHT of memory
  (an uploader being checked keeps one read of its body, READ_BYTES).

daphne's command line takes its Server class from ``CommandLineInterface.server_class``; the
Server builds its HTTP factory in ``run()`` as ``self.http_factory``, which ``FrontServer`` takes
as ``FrontHTTPFactory``, whose protocol is ``FrontHTTPChannel`` (Twisted's public
``Factory.protocol``: plain HTTP/1.1, which is what the front speaks behind its TLS-terminating
proxy; Twisted's HTTP/2-over-TLS negotiation wrapper is not used), whose requests are
``FrontRequest`` (Twisted's public ``HTTPChannel.requestFactory``). Start-up raises (``FrontServer.check_hooks``, before the reactor
runs) if daphne listens with any other factory. tests/fleetadmin/test_front.py shows the first parse off and
the 413 before the body; tests/fleetadmin/test_front_limits.py the limits per client, user and door.

Length: the server's hooks and the front's limits on bodies are one piece (each limit is taken
where Twisted hands over a request's head or a chunk of its body); split, each half would reach
into the other's state.
"""

from __future__ import annotations

import io
import json
import sys
import time
from collections import Counter

from daphne.cli import CommandLineInterface
from daphne.http_protocol import HTTPFactory, WebRequest
from daphne.server import Server
from daphne.utils import parse_x_forwarded_for
from django.conf import settings
from django.db import connection
from django.urls import reverse
from django.utils.html import format_html
from twisted.internet import threads
from twisted.internet.task import LoopingCall
from twisted.web.http import HTTPChannel

from fleetadmin.asgi import BODY_EXTENSION
from fleetadmin.formdata import FormData

REFUSED_CLOSE_SECONDS = 5.0
# The budgets a body's slot is taken from (FrontHTTPFactory): CHECK, while its uploader is checked
# (what came of the body meanwhile is kept: one read, READ_BYTES at most, a check).
SMALL, LARGE, CHECK = "small", "large", "check"
# The paths that take large bodies (files), from a caller known before the body is read.
UPLOAD_URL_NAMES = ("api-jobs", "jobs-new", "jobs-forecast")
UPLOADS_SHOWN = "POST /v1/jobs, /jobs/new, /jobs/forecast"
# Refusals on these paths are JSON, as the API's errors are; on any other path, a plain page.
JSON_PATHS = (b"/v1/", b"/healthz", b"/metrics")
REFUSAL_PAGE = "<!doctype html><title>{status} {reason}</title><h1>{reason}</h1><p>{error}</p>\n"
# What a connection reads at a time (FrontHTTPChannel.connectionMade says why).
READ_BYTES = 256 * 1024
# A body behind the minimum rate for this long gives its slot to a new one when every slot is held.
EVICTABLE_AFTER_SECONDS = 1.0


class FrontRequest(WebRequest):
    """daphne's request without Twisted's parse of form bodies, admitting its body (or refusing it
    before it is read) by its size, its path, its caller and its client address."""

    def __init__(self, channel, *args, **kwargs) -> None:
        super().__init__(channel, *args, parsePOSTFormSubmission=False, **kwargs)
        self.received = 0
        self.refused = False
        self.body_since: float | None = None  # while the body is being received (or its caller checked): since when
        self.head: tuple[bytes, bytes] = (b"", b"")  # the method and path (FrontHTTPChannel.lineReceived)
        self.client = ""  # the client's address (the proxy's header with --proxy-headers)
        self.counted = False  # counted in FRONT_MAX_BODIES_PER_CLIENT for its client
        self.kind: str | None = None  # the budget whose slot the body holds: SMALL or LARGE
        self.user_id: int | None = None  # a large body's uploader
        self.checking = False  # its caller is being checked: the body waits (check_uploader)
        self.early: list[bytes] = []  # what came of the body meanwhile
        self.held: tuple | None = None  # requestReceived's arguments, if all of it came meanwhile
        self.expects_continue = False
        self.paused = False  # the connection, by check_uploader
        self.gone = False

    def gotLength(self, length: int | None) -> None:
        self.channel.headers_since = None
        if length is not None and length > settings.OCR_MAX_REQUEST_BYTES:
            self.refuse()  # (the body is dropped as it arrives)
            return
        if length == 0:
            super().gotLength(length)
            return
        factory = self.channel.factory
        small_limit = settings.FRONT_SMALL_BODY_BYTES
        large = length is None or length > small_limit  # (a chunked body may be: it is one only for an uploader)
        upload = self.head[0] == b"POST" and self.head[1] in factory.upload_paths
        credentials = self.credentials() if large and upload else None
        if length is not None and large and credentials is None:
            if upload:
                self.refuse(401, "Unauthorized", f"a body over {small_limit} bytes needs a token that may submit "
                            "or a logged-in session")  # fmt: skip
            else:
                self.refuse(error=f"a body over {small_limit} bytes is taken only by an upload ({UPLOADS_SHOWN})")
            return
        self.client = client_address(self)
        if not factory.count_client(self):
            limit = settings.FRONT_MAX_BODIES_PER_CLIENT
            self.refuse(429, "Too Many Requests", f"{limit} bodies from this address are being received; retry shortly")
            return
        self.body_since = time.monotonic()
        if not factory.take_slot(self, SMALL if credentials is None else CHECK):
            self.refuse(503, "Service Unavailable", "too many bodies are being received; retry shortly")
        elif credentials is None:
            self.open_body(length)
        else:
            self.check_uploader(length, credentials)

    def credentials(self) -> tuple[str, str] | None:
        """The request's bearer token or session cookie (Authorization first, as the API reads them)."""
        authorization = self.requestHeaders.getRawHeaders(b"authorization")
        session = self.received_cookies.get(settings.SESSION_COOKIE_NAME.encode())
        if authorization:
            return authorization[0].decode("latin-1"), ""
        return ("", session.decode("latin-1")) if session else None

    def check_uploader(self, length: int | None, credentials: tuple[str, str]) -> None:
        """Ask who the caller is on a thread of Twisted's pool (a database read; never on the
        reactor), reading nothing more of the connection meanwhile; a 100-continue is answered
        once the body is admitted."""
        self.checking = True
        self.pause()
        expect = self.requestHeaders.getRawHeaders(b"expect")
        if expect and expect[0].lower() == b"100-continue":
            self.expects_continue = True
            self.requestHeaders.removeHeader(b"Expect")  # (else Twisted answers 100-continue after gotLength)
        checked = threads.deferToThread(check_uploader, *credentials)
        checked.addCallbacks(lambda user_id: self.uploader_checked(length, user_id), self.uploader_check_failed)

    def uploader_checked(self, length: int | None, user_id: int | None) -> None:
        self.checking = False
        if self.refused or self.gone:
            return
        factory = self.channel.factory
        factory.give_back_slot(self)  # (the check's: an upload's is taken next)
        if user_id is None:
            self.refuse(401, "Unauthorized", "unknown or revoked token, or no logged-in session: a body over "
                        f"{settings.FRONT_SMALL_BODY_BYTES} bytes needs a token that may submit or a session")  # fmt: skip
        elif not factory.count_user(self, user_id):
            limit = settings.FRONT_MAX_UPLOADS_PER_USER
            self.refuse(429, "Too Many Requests", f"{limit} of your uploads are being received; retry shortly")
        elif not factory.take_slot(self, LARGE):
            self.refuse(503, "Service Unavailable", "too many uploads are being received; retry shortly")
        else:
            if self.expects_continue:
                self.channel.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            self.open_body(length)
            early, self.early = self.early, []
            for data in early:
                self.handleContentChunk(data)
        self.resume()
        if self.held is not None:
            self.requestReceived(*self.held)

    def pause(self) -> None:
        if not self.paused:
            self.paused = True
            self.channel.transport.pauseProducing()

    def resume(self) -> None:
        if self.paused:
            self.paused = False
            self.channel.transport.resumeProducing()

    def uploader_check_failed(self, failure) -> None:
        self.checking = False
        if not (self.refused or self.gone):
            failure.printTraceback()
            self.refuse(503, "Service Unavailable", "the caller could not be checked; retry shortly")
            if self.held is not None:
                self.channel.transport.loseConnection()

    def open_body(self, length: int | None) -> None:
        """Where the admitted body goes: a form read as it arrives, or Twisted's content file."""
        form = self.form_for_body() if length else None
        if form is None:
            super().gotLength(length)
        else:
            self.content = form  # (Twisted's public Request.content: what the body is written to)

    def form_for_body(self) -> FormData | None:
        """A multipart form body of a stated length is read as it arrives (fleetadmin/formdata.py):
        no temporary file of the whole body, read back and written out again file by file."""
        content_type = self.requestHeaders.getRawHeaders(b"content-type")
        return FormData.for_content_type(content_type[0].decode("latin-1")) if content_type else None

    def handleContentChunk(self, data: bytes) -> None:
        if self.refused:
            return
        if self.checking:
            self.early.append(data)  # (one read's worth: the connection is paused)
            self.pause()
            return
        self.received += len(data)
        if self.kind == SMALL and self.received > settings.FRONT_SMALL_BODY_BYTES:  # a chunked body, not an upload
            self.refuse(error=f"a body over {settings.FRONT_SMALL_BODY_BYTES} bytes is taken only by an upload "
                        f"({UPLOADS_SHOWN}) with a token that may submit or a logged-in session")  # fmt: skip
            return
        if self.received > settings.OCR_MAX_REQUEST_BYTES:  # a chunked body passing the limit
            self.refuse()
            return
        super().handleContentChunk(data)

    def requestReceived(self, command, path, version) -> None:
        if self.checking:  # the whole body came while its caller is checked: handled once known
            self.held = (command, path, version)
            return
        if isinstance(self.content, FormData) and command != b"POST" and not self.refused:
            # (Django reads a form from a POST only: another method's body is its own to read)
            self.refuse(400, "Bad Request", "a multipart/form-data body is taken with POST only")
        self.body_received()
        if self.refused:  # the whole body came and was dropped: nothing more to read
            self.channel.transport.loseConnection()
            return
        super().requestReceived(command, path, version)

    def connectionLost(self, reason) -> None:
        self.gone = True
        self.body_received()
        super().connectionLost(reason)

    def drop_body(self) -> None:
        """What was received of the body is dropped (a form's files removed), and what comes next."""
        if self.content is not None and not self.content.closed:
            self.content.close()
        self.early = []
        self.content = io.BytesIO()  # (never written to: refused, the rest of the body is not kept)

    def body_received(self) -> None:
        self.body_since = None
        self.channel.factory.release(self)

    def too_slow(self, now: float) -> bool:
        """Whether the body arrives slower than the minimum rate, past its grace."""
        if self.body_since is None or self.refused:
            return False
        late = now - self.body_since - settings.FRONT_BODY_GRACE_SECONDS
        return late > 0 and self.received < late * settings.FRONT_BODY_MIN_BYTES_PER_SECOND

    def deadline(self) -> float:
        """The total time the body may take: a small one's, or an upload's."""
        return settings.FRONT_SMALL_BODY_SECONDS if self.kind == SMALL else settings.FRONT_BODY_DEADLINE_SECONDS

    def too_long(self, now: float) -> bool:
        """Whether the body has taken longer than its total time, however fast it comes."""
        return self.body_since is not None and not self.refused and now - self.body_since > self.deadline()

    def rate_behind(self, now: float) -> float | None:
        """The rate the body arrives at, if it is behind the minimum rate and has been received for
        EVICTABLE_AFTER_SECONDS at least (its grace aside); None otherwise."""
        if self.body_since is None or self.refused or now - self.body_since < EVICTABLE_AFTER_SECONDS:
            return None
        rate = self.received / (now - self.body_since)
        return rate if rate < settings.FRONT_BODY_MIN_BYTES_PER_SECOND else None

    def refuse(self, status: int = 413, reason: str = "Request Entity Too Large", error: str = "") -> None:
        """An error (JSON, as the API answers its errors, on the API's paths; a plain page on the
        others), and no more of this connection's bytes kept: the answer goes out at once and the
        sending side is closed; what the client still sends is read and dropped (closing at once
        would reset the connection before the client read it)."""
        self.refused = True
        self.body_received()
        self.drop_body()
        self.requestHeaders.removeHeader(b"Expect")  # (Twisted answers 100-continue after gotLength)
        error = error or f"the request is larger than the limit of {settings.OCR_MAX_REQUEST_BYTES} bytes"
        if self.head[1].startswith(JSON_PATHS):
            content_type, body = b"application/json", json.dumps({"error": error}).encode()
        else:
            content_type = b"text/html; charset=utf-8"
            body = format_html(REFUSAL_PAGE, status=status, reason=reason, error=error).encode()
        retry = b"Retry-After: 1\r\n" if status in (429, 503) else b""
        head = b"HTTP/1.1 %d %s\r\nContent-Type: %s\r\n%sContent-Length: %d\r\nConnection: close\r\n\r\n" % (
            status,
            reason.encode(),
            content_type,
            retry,
            len(body),
        )
        transport = self.channel.transport
        self.resume()  # (paused while its caller was checked: what comes is read and dropped)
        transport.write(head + body)
        transport.loseWriteConnection()
        # A client that goes on sending (slowly) is not kept: it had time enough to read the answer.
        self.channel.callLater(REFUSED_CLOSE_SECONDS, transport.abortConnection)


class FrontHTTPChannel(HTTPChannel):
    """Twisted's HTTP/1.1 channel, which knows since when it waits for a request's headers."""

    def __init__(self) -> None:
        super().__init__()
        self.headers_since: float | None = None

    def connectionMade(self) -> None:
        super().connectionMade()
        # Twisted's transports read 64 KiB at a time (FileDescriptor.bufferSize, a public
        # attribute), and each read passes a dozen Python calls on its way to the form: reading up
        # to 256 KiB, bench/uploads.py's front took 5.09 / 5.25 s against 5.82 / 5.56 s (2,500
        # pages, alternated). It also bounds what a connection buffers of an answer before a
        # streamed download's producer is paused: 256 KiB instead of 64 KiB.
        self.transport.bufferSize = READ_BYTES
        self.headers_since = time.monotonic()
        self.factory.channels.add(self)

    def connectionLost(self, reason) -> None:
        self.factory.channels.discard(self)
        super().connectionLost(reason)

    def lineReceived(self, line: bytes) -> None:
        # Twisted makes a request of a request line (and keeps its method and path to itself until
        # the whole body came): the front needs them before, to admit the body.
        requests = len(self.requests)
        super().lineReceived(line)
        if len(self.requests) > requests:
            method, _, rest = line.partition(b" ")
            self.requests[-1].head = (method, rest.partition(b" ")[0].partition(b"?")[0])

    def requestDone(self, request) -> None:
        # Set before the next request's buffered bytes are parsed, which clears it again.
        self.headers_since = time.monotonic()
        super().requestDone(request)

    def check_deadlines(self, now: float) -> None:
        if getattr(self.transport, "protocol", self) is not self:  # upgraded to a websocket
            self.factory.channels.discard(self)
            return
        if self.headers_since is not None and now - self.headers_since > settings.FRONT_HEADER_TIMEOUT_SECONDS:
            self.factory.channels.discard(self)
            self.transport.abortConnection()  # (headers never came: no request to answer)
            return
        for request in self.requests:
            if request.too_slow(now):
                rate = settings.FRONT_BODY_MIN_BYTES_PER_SECOND
                request.refuse(408, "Request Timeout", f"the body arrived slower than {rate} bytes/s")
            elif request.too_long(now):
                request.refuse(408, "Request Timeout", f"the body did not arrive within {request.deadline():g} s")


class FrontHTTPFactory(HTTPFactory):
    """The front's connections, and the bodies they are receiving: a small body (at most
    FRONT_SMALL_BODY_BYTES) takes one of FRONT_MAX_SMALL_BODIES_IN_FLIGHT slots, an upload one of
    FRONT_MAX_BODIES_IN_FLIGHT, at most FRONT_MAX_UPLOADS_PER_USER of them per user (and as many
    callers of uploads may be checked at once, each holding at most a read of its body); a client
    address has at most FRONT_MAX_BODIES_PER_CLIENT bodies of either kind (or callers being
    checked) in flight."""

    protocol = FrontHTTPChannel

    def __init__(self, server) -> None:
        super().__init__(server)
        self.channels: set[FrontHTTPChannel] = set()
        self.bodies: dict[str, set[FrontRequest]] = {SMALL: set(), LARGE: set(), CHECK: set()}
        self.by_client: Counter[str] = Counter()
        self.by_user: Counter[int] = Counter()
        self.upload_paths = {reverse(name).encode() for name in UPLOAD_URL_NAMES}
        self.deadlines = LoopingCall(self.check_deadlines)

    def buildProtocol(self, addr):
        protocol = super().buildProtocol(addr)
        protocol.requestFactory = FrontRequest
        return protocol

    def startFactory(self) -> None:
        super().startFactory()
        self.deadlines.clock = self.reactor
        self.deadlines.start(1.0, now=False)

    def stopFactory(self) -> None:
        if self.deadlines.running:
            self.deadlines.stop()
        super().stopFactory()

    def check_deadlines(self) -> None:
        now = time.monotonic()
        for channel in list(self.channels):
            channel.check_deadlines(now)

    def count_client(self, request: FrontRequest) -> bool:
        """Count a body against its client address; False if that address has its most in flight."""
        if self.by_client[request.client] >= settings.FRONT_MAX_BODIES_PER_CLIENT:
            return False
        self.by_client[request.client] += 1
        request.counted = True
        return True

    def count_user(self, request: FrontRequest, user_id: int) -> bool:
        """Count an upload against its user; False if that user has their most in flight."""
        if self.by_user[user_id] >= settings.FRONT_MAX_UPLOADS_PER_USER:
            return False
        self.by_user[user_id] += 1
        request.user_id = user_id
        return True

    def take_slot(self, request: FrontRequest, kind: str) -> bool:
        """A slot of the kind's budget for the body, if one is free or can be freed (evict_slowest)."""
        limit = settings.FRONT_MAX_SMALL_BODIES_IN_FLIGHT if kind == SMALL else settings.FRONT_MAX_BODIES_IN_FLIGHT
        if len(self.bodies[kind]) >= limit and not self.evict_slowest(kind):
            return False
        self.bodies[kind].add(request)
        request.kind = kind
        return True

    def give_back_slot(self, request: FrontRequest) -> None:
        if request.kind is not None:
            self.bodies[request.kind].discard(request)
            request.kind = None

    def release(self, request: FrontRequest) -> None:
        """What the request held: its slot, its count for its client and its user's."""
        self.give_back_slot(request)
        for counter, key, held in ((self.by_client, request.client, request.counted),
                                   (self.by_user, request.user_id, request.user_id is not None)):  # fmt: skip
            if held:
                counter[key] -= 1
                if counter[key] <= 0:
                    del counter[key]
        request.counted, request.user_id = False, None

    def evict_slowest(self, kind: str) -> bool:
        """Every body slot of the kind is held: cut off the slowest body behind the minimum rate (a
        JSON 408), so that its slot goes to the new one; False if none is behind. Without it, slow
        clients that hold every slot in turn (each cut off after its grace, then back) kept uploads
        out: bench/hostile.py's 150 slow clients had its one-page upload refused 16 times."""
        now = time.monotonic()
        behind = [(rate, request) for request in self.bodies[kind] if (rate := request.rate_behind(now)) is not None]
        if not behind:
            return False
        _, slowest = min(behind, key=lambda pair: pair[0])
        rate = settings.FRONT_BODY_MIN_BYTES_PER_SECOND
        slowest.refuse(408, "Request Timeout", f"the body arrived slower than {rate} bytes/s while every upload "
                       "slot was taken")  # fmt: skip
        return True


def client_address(request: FrontRequest) -> str:
    """The request's client address, as daphne gives it to Django (WebRequest.process): the
    connection's peer, or with --proxy-headers the first address of the proxy's header."""
    peer = request.channel.transport.getPeer()
    address = [str(getattr(peer, "host", "")), getattr(peer, "port", 0)]
    server = request.channel.factory.server
    header = getattr(server, "proxy_forwarded_address_header", None)
    if header:
        forwarded, _ = parse_x_forwarded_for(request.requestHeaders, header, server.proxy_forwarded_port_header,
                                             server.proxy_forwarded_proto_header, address, None)  # fmt: skip
        address = forwarded or address
    return str(address[0])


def check_uploader(authorization: str, session_key: str) -> int | None:
    """fleetadmin.api.uploader_id on a thread of Twisted's pool, its database connection closed
    after (back to the front's pool)."""
    # function-level: fleetadmin.api imports models, which need the apps that fleetadmin.asgi sets up
    from fleetadmin.api import uploader_id

    try:
        return uploader_id(authorization=authorization, session_key=session_key)
    finally:
        connection.close()


class FrontServer(Server):
    """daphne's Server with FrontHTTPFactory and the body handed over to Django."""

    def __init__(self, *args, **kwargs) -> None:
        ready = kwargs.pop("ready_callable", None)

        def check_then_ready() -> None:
            self.check_hooks()
            if ready is not None:
                ready()

        super().__init__(*args, ready_callable=check_then_ready, **kwargs)

    @property
    def http_factory(self) -> HTTPFactory:
        return self._http_factory

    @http_factory.setter
    def http_factory(self, factory: HTTPFactory) -> None:
        # daphne's run() makes its HTTPFactory and listens with it: ours, in its place.
        self._http_factory = FrontHTTPFactory(self) if type(factory) is HTTPFactory else factory

    def check_hooks(self) -> None:
        """Raise unless daphne listens with FrontHTTPFactory (daphne calls this before its reactor
        runs: the process exits instead of serving uploads the stock way)."""
        factory = getattr(self, "_http_factory", None)
        if not isinstance(factory, FrontHTTPFactory):
            raise RuntimeError(f"daphne listens with {factory!r}, not FrontHTTPFactory: fleetadmin/front.py")

    def create_application(self, protocol, scope):
        hand_over_body(protocol, scope)
        return super().create_application(protocol, scope)


def hand_over_body(protocol, scope: dict) -> None:
    """Put an HTTP request's body file (Twisted's content) in its scope for Django, at its end:
    daphne, which reads it next, queues one empty message instead of the body's chunks."""
    content = getattr(protocol, "content", None)
    if scope.get("type") == "http" and content is not None and not content.closed:
        scope.setdefault("extensions", {})[BODY_EXTENSION] = content
        content.seek(0, io.SEEK_END)


class FrontCommandLine(CommandLineInterface):
    server_class = FrontServer


def main(argv: list[str] | None = None) -> None:
    FrontCommandLine().run(sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    from fleetadmin import front  # function-level: the module's own classes, not a second copy as __main__

    front.main()
