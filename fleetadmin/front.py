"""The front's server: daphne, with what stock daphne and Twisted get wrong for uploads put right
through their public hooks. Started as ``python -m fleetadmin.front`` with daphne's own arguments
(``-b 0.0.0.0 -p 8000 fleetadmin.asgi:application``).

Out of the box a multipart POST body is held whole in memory twice over: Twisted parses it into
``request.args`` (``content.read()``, then the email package), which daphne never reads, and
daphne reads the body back and queues every chunk of it to the application at once. Here:
- ``FrontRequest`` is built with Twisted's public ``parsePOSTFormSubmission=False``: no first
  parse (it was ~80% of the front's CPU on uploads);
- ``FrontServer.create_application`` hands Twisted's content file (a BytesIO under 100 kB, else a
  temporary file) to Django in the request's scope (``BODY_EXTENSION``), left at its end so that
  daphne queues one empty message; fleetadmin.asgi's handler reads it as the body file. The body
  is received once and read once, by Django's multipart parser;
- a body over OCR_MAX_REQUEST_BYTES gets a 413 as soon as its Content-Length says so, before a
  byte of it is stored, and a chunked one once it passes the limit; the rest of it is dropped.

daphne's command line takes its Server class from ``CommandLineInterface.server_class``; the
Server builds its HTTP factory in ``run()`` as ``self.http_factory``, which ``FrontServer`` takes
as ``FrontHTTPFactory``, whose protocols build ``FrontRequest`` (Twisted's public
``HTTPChannel.requestFactory``). Start-up raises (``FrontServer.check_hooks``, before the reactor
runs) if daphne listens with any other factory. tests/test_front.py shows the first parse off and
the 413 before the body.
"""

from __future__ import annotations

import io
import json
import sys

from daphne.cli import CommandLineInterface
from daphne.http_protocol import HTTPFactory, WebRequest
from daphne.server import Server
from django.conf import settings

from fleetadmin.asgi import BODY_EXTENSION


class FrontRequest(WebRequest):
    """daphne's request without Twisted's parse of form bodies, refusing a body over the limit."""

    def __init__(self, channel, *args, **kwargs) -> None:
        super().__init__(channel, *args, parsePOSTFormSubmission=False, **kwargs)
        self.received = 0
        self.refused = False

    def gotLength(self, length: int | None) -> None:
        if length is not None and length > settings.OCR_MAX_REQUEST_BYTES:
            self.content = io.BytesIO()  # (never written to: the body is dropped as it arrives)
            self.refuse()
            return
        super().gotLength(length)

    def handleContentChunk(self, data: bytes) -> None:
        if self.refused:
            return
        self.received += len(data)
        if self.received > settings.OCR_MAX_REQUEST_BYTES:  # a chunked body passing the limit
            self.refuse()
            return
        super().handleContentChunk(data)

    def requestReceived(self, command, path, version) -> None:
        if self.refused:  # the whole body came and was dropped: nothing more to read
            self.channel.transport.loseConnection()
            return
        super().requestReceived(command, path, version)

    def refuse(self) -> None:
        """A JSON 413, as the API answers its errors, and no more of this connection's bytes kept:
        the answer goes out at once and the sending side is closed; what the client still sends is
        read and dropped (closing at once would reset the connection before the client read it)."""
        self.refused = True
        self.requestHeaders.removeHeader(b"Expect")  # (Twisted answers 100-continue after gotLength)
        limit = settings.OCR_MAX_REQUEST_BYTES
        body = json.dumps({"error": f"the request is larger than the limit of {limit} bytes"}).encode()
        head = (
            b"HTTP/1.1 413 Request Entity Too Large\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body)
        )
        transport = self.channel.transport
        transport.write(head + body)
        transport.loseWriteConnection()


class FrontHTTPFactory(HTTPFactory):
    def buildProtocol(self, addr):
        protocol = super().buildProtocol(addr)
        protocol.requestFactory = FrontRequest
        return protocol


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
    from fleetadmin import front  # (the module's own classes, not a second copy as __main__)

    front.main()
