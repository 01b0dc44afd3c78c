"""Request bodies in the front: received once, read once.

Out of the box a body is copied about six times on its way to an upload handler: twisted spools
a body over 100 kB to a temporary file, daphne reads it back and queues it to the application in
chunks (every chunk at once: the whole body passes through memory anyway), and Django's
ASGIHandler writes the chunks to a spool of its own that rolls over to disk above
FILE_UPLOAD_MAX_MEMORY_SIZE, before the multipart parser reads it again. On bench/ingest.py
those copies were about half of the front's CPU (py-spy).

Here, in the daphne that serves fleetadmin/asgi.py:
- twisted keeps a body of up to REQUEST_BODY_MEMORY_BYTES (Content-Length) in memory, a larger
  one (or one of unknown length) in its temporary file, as before;
- daphne hands that body over as it is, in the request's scope (``BODY_EXTENSION``): it queues
  one empty message instead of the body's chunks;
- ``FrontASGIHandler`` takes it from the scope as its body file. Django closes it when the
  request ends, as it closes its own spool.
So the multipart parser reads the bytes twisted received, from memory or from one file.

Memory: each request in flight holds at most REQUEST_BODY_MEMORY_BYTES of body (a larger one is
on disk, and no longer passes through daphne's queue).
"""

from __future__ import annotations

import contextvars
import io
import sys

from django.conf import settings
from django.core.exceptions import RequestAborted
from django.core.handlers.asgi import ASGIHandler

BODY_EXTENSION = "fleetadmin.body"
# What twisted reads from the socket at a time on a connection sending a large body (its default,
# 64 KiB, cost a pass through four Python calls for every 64 KiB of an upload).
RECEIVE_BYTES = 1024 * 1024

# The body handed over with the request being handled (each ASGI request runs as a task of its own).
_handed_body: contextvars.ContextVar = contextvars.ContextVar("handed_body", default=None)


def patch_daphne() -> None:
    """Twisted parses every multipart POST body into ``request.args`` with the email package before
    daphne hands the body to Django, which parses it again; daphne never reads ``args``. That first
    parse was ~80% of the front's CPU on uploads (bench/ingest.py, py-spy): turned off here. And
    bodies are kept in memory up to the cap, and handed over whole (the module's docstring)."""
    protocol = sys.modules.get("daphne.http_protocol")
    server = sys.modules.get("daphne.server")
    if protocol is None or server is None or getattr(protocol.WebRequest, "_fleetadmin_bodies", False):
        return
    original_init = protocol.WebRequest.__init__
    original_got_length = protocol.WebRequest.gotLength
    original_create = server.Server.create_application

    def __init__(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        self._parsePOSTFormSubmission = False

    def gotLength(self, length):
        transport = getattr(self.channel, "transport", None)
        if (length is None or length > RECEIVE_BYTES) and transport is not None:
            transport.bufferSize = RECEIVE_BYTES
        if length is not None and length <= settings.REQUEST_BODY_MEMORY_BYTES:
            self.content = BodyInMemory()
        else:
            original_got_length(self, length)  # a temporary file (a BytesIO under 100 kB)

    def create_application(self, protocol_instance, scope):
        content = getattr(protocol_instance, "content", None)
        if scope.get("type") == "http" and content is not None and not content.closed:
            body = content.file() if isinstance(content, BodyInMemory) else content
            scope.setdefault("extensions", {})[BODY_EXTENSION] = body
            protocol_instance.content = io.BytesIO()  # what daphne queues: one empty message
        return original_create(self, protocol_instance, scope)

    protocol.WebRequest.__init__ = __init__
    protocol.WebRequest.gotLength = gotLength
    server.Server.create_application = create_application
    protocol.WebRequest._fleetadmin_bodies = True


class BodyInMemory:
    """Twisted's content file for a body kept in memory: the chunks as they arrive (no copy, where
    a BytesIO grew and copied its buffer: ~15% of the front's GIL on bench/ingest.py), joined once
    into a BytesIO (which shares the joined bytes) when the body is read or handed over."""

    def __init__(self) -> None:
        self._chunks: list[bytes] = []
        self._size = 0
        self._file: io.BytesIO | None = None

    def write(self, data: bytes) -> int:
        if self._file is not None:
            return self._file.write(data)
        self._chunks.append(data)
        self._size += len(data)
        return len(data)

    def tell(self) -> int:
        return self._size if self._file is None else self._file.tell()

    @property
    def closed(self) -> bool:
        return self._file is not None and self._file.closed

    def file(self) -> io.BytesIO:
        """The body as one file, at the position written to."""
        if self._file is None:
            self._file = io.BytesIO(b"".join(self._chunks))
            self._file.seek(self._size)
            self._chunks = []
        return self._file

    def __getattr__(self, name: str):
        return getattr(self.file(), name)  # seek, read, close ...


class FrontASGIHandler(ASGIHandler):
    """Django's ASGI handler, taking a body daphne handed over in the scope as its body file.
    Without one (another server, a test) it reads the body's messages as Django does."""

    async def handle(self, scope, receive, send):
        _handed_body.set(scope.get("extensions", {}).get(BODY_EXTENSION))
        return await super().handle(scope, receive, send)

    async def read_body(self, receive):
        body = _handed_body.get()
        if body is None:
            return await super().read_body(receive)
        while True:
            message = await receive()  # daphne's one empty message
            if message["type"] == "http.disconnect":
                body.close()
                raise RequestAborted()
            if not message.get("more_body", False):
                break
        body.seek(0)
        return body
