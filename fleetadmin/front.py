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
  keep up FRONT_BODY_MIN_BYTES_PER_SECOND after FRONT_BODY_GRACE_SECONDS (else a JSON 408), and at
  most FRONT_MAX_BODIES_IN_FLIGHT bodies are received at once (past it, the slowest body that has
  been behind the minimum rate for EVICTABLE_AFTER_SECONDS gets a JSON 408 and its place goes to
  the new one; if none is behind, the new one gets a JSON 503 with Retry-After before it is read). Twisted keeps a body under 100 kB in memory and a larger or
  chunked one in a temporary file, and a form keeps at most 100 kB of fields in memory
  (formdata.FIELDS_IN_MEMORY_BYTES), so bodies hold at most about 100 kB x FRONT_MAX_BODIES_IN_FLIGHT
  of memory between them.

daphne's command line takes its Server class from ``CommandLineInterface.server_class``; the
Server builds its HTTP factory in ``run()`` as ``self.http_factory``, which ``FrontServer`` takes
as ``FrontHTTPFactory``, whose protocol is ``FrontHTTPChannel`` (Twisted's public
``Factory.protocol``: plain HTTP/1.1, which is what the front speaks behind its TLS-terminating
proxy; Twisted's HTTP/2-over-TLS negotiation wrapper is not used), whose requests are
``FrontRequest`` (Twisted's public ``HTTPChannel.requestFactory``). Start-up raises (``FrontServer.check_hooks``, before the reactor
runs) if daphne listens with any other factory. tests/fleetadmin/test_front.py shows the first parse off and
the 413 before the body.
"""

from __future__ import annotations

import io
import json
import sys
import time

from daphne.cli import CommandLineInterface
from daphne.http_protocol import HTTPFactory, WebRequest
from daphne.server import Server
from django.conf import settings
from twisted.internet.task import LoopingCall
from twisted.web.http import HTTPChannel

from fleetadmin.asgi import BODY_EXTENSION
from fleetadmin.formdata import FormData

REFUSED_CLOSE_SECONDS = 5.0
# What a connection reads at a time (FrontHTTPChannel.connectionMade says why).
READ_BYTES = 256 * 1024
# A body behind the minimum rate for this long gives its slot to a new one when every slot is held.
EVICTABLE_AFTER_SECONDS = 1.0


class FrontRequest(WebRequest):
    """daphne's request without Twisted's parse of form bodies, refusing a body over the limit."""

    def __init__(self, channel, *args, **kwargs) -> None:
        super().__init__(channel, *args, parsePOSTFormSubmission=False, **kwargs)
        self.received = 0
        self.refused = False
        self.body_since: float | None = None  # while the body is being received: since when

    def gotLength(self, length: int | None) -> None:
        self.channel.headers_since = None
        if length is not None and length > settings.OCR_MAX_REQUEST_BYTES:
            self.refuse()  # (the body is dropped as it arrives)
            return
        if length != 0:  # a body to come (None: chunked)
            factory = self.channel.factory
            if len(factory.bodies) >= settings.FRONT_MAX_BODIES_IN_FLIGHT and not factory.evict_slowest():
                self.refuse(503, "Service Unavailable", "too many uploads are being received; retry shortly")
                return
            factory.bodies.add(self)
            self.body_since = time.monotonic()
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
        self.received += len(data)
        if self.received > settings.OCR_MAX_REQUEST_BYTES:  # a chunked body passing the limit
            self.refuse()
            return
        super().handleContentChunk(data)

    def requestReceived(self, command, path, version) -> None:
        if isinstance(self.content, FormData) and command != b"POST" and not self.refused:
            # (Django reads a form from a POST only: another method's body is its own to read)
            self.refuse(400, "Bad Request", "a multipart/form-data body is taken with POST only")
        self.body_received()
        if self.refused:  # the whole body came and was dropped: nothing more to read
            self.channel.transport.loseConnection()
            return
        super().requestReceived(command, path, version)

    def connectionLost(self, reason) -> None:
        self.body_received()
        super().connectionLost(reason)

    def drop_body(self) -> None:
        """What was received of the body is dropped (a form's files removed), and what comes next."""
        if self.content is not None and not self.content.closed:
            self.content.close()
        self.content = io.BytesIO()  # (never written to: refused, the rest of the body is not kept)

    def body_received(self) -> None:
        self.body_since = None
        self.channel.factory.bodies.discard(self)

    def too_slow(self, now: float) -> bool:
        """Whether the body arrives slower than the minimum rate, past its grace."""
        if self.body_since is None or self.refused:
            return False
        late = now - self.body_since - settings.FRONT_BODY_GRACE_SECONDS
        return late > 0 and self.received < late * settings.FRONT_BODY_MIN_BYTES_PER_SECOND

    def rate_behind(self, now: float) -> float | None:
        """The rate the body arrives at, if it is behind the minimum rate and has been received for
        EVICTABLE_AFTER_SECONDS at least (its grace aside); None otherwise."""
        if self.body_since is None or self.refused or now - self.body_since < EVICTABLE_AFTER_SECONDS:
            return None
        rate = self.received / (now - self.body_since)
        return rate if rate < settings.FRONT_BODY_MIN_BYTES_PER_SECOND else None

    def refuse(self, status: int = 413, reason: str = "Request Entity Too Large", error: str = "") -> None:
        """A JSON error, as the API answers its errors, and no more of this connection's bytes
        kept: the answer goes out at once and the sending side is closed; what the client still
        sends is read and dropped (closing at once would reset the connection before the client
        read it)."""
        self.refused = True
        self.body_received()
        self.drop_body()
        self.requestHeaders.removeHeader(b"Expect")  # (Twisted answers 100-continue after gotLength)
        error = error or f"the request is larger than the limit of {settings.OCR_MAX_REQUEST_BYTES} bytes"
        body = json.dumps({"error": error}).encode()
        retry = b"Retry-After: 1\r\n" if status == 503 else b""
        head = (
            b"HTTP/1.1 %d %s\r\nContent-Type: application/json\r\n%s"
            b"Content-Length: %d\r\nConnection: close\r\n\r\n" % (status, reason.encode(), retry, len(body))
        )
        transport = self.channel.transport
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


class FrontHTTPFactory(HTTPFactory):
    protocol = FrontHTTPChannel

    def __init__(self, server) -> None:
        super().__init__(server)
        self.channels: set[FrontHTTPChannel] = set()
        self.bodies: set[FrontRequest] = set()
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

    def evict_slowest(self) -> bool:
        """Every body slot is held: cut off the slowest body behind the minimum rate (a JSON 408),
        so that its slot goes to the new one; False if none is behind. Without it, slow clients
        that hold every slot in turn (each cut off after its grace, then back) kept uploads out:
        bench/hostile.py's 150 slow clients had its one-page upload refused 16 times."""
        now = time.monotonic()
        behind = [(rate, request) for request in self.bodies if (rate := request.rate_behind(now)) is not None]
        if not behind:
            return False
        _, slowest = min(behind, key=lambda pair: pair[0])
        rate = settings.FRONT_BODY_MIN_BYTES_PER_SECOND
        slowest.refuse(408, "Request Timeout", f"the body arrived slower than {rate} bytes/s while every upload "
                       "slot was taken")  # fmt: skip
        return True


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
