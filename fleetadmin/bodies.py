"""Request bodies in the front: received once, read once.

Out of the box a body is copied about six times on its way to an upload handler: twisted spools
a body over 100 kB to a temporary file, daphne reads it back and queues it to the application in
chunks (every chunk at once: the whole body passes through memory anyway), and Django's
ASGIHandler writes the chunks to a spool of its own that rolls over to disk above
FILE_UPLOAD_MAX_MEMORY_SIZE, before the multipart parser reads it again. On bench/ingest.py
those copies were about half of the front's CPU (py-spy).

Here, in the daphne that serves fleetadmin/asgi.py:
- twisted keeps a body of up to REQUEST_BODY_MEMORY_BYTES (Content-Length) in memory, a larger
  one (or one of unknown length) in its temporary file, as before. In memory, the body is one
  buffer of its length that the socket reads into (``BodyInMemory``, ``_read_into``): no bytes
  object per read, no join of them afterwards, and a buffer the readers can point into
  (pypdfium2 opens a PDF where it lies: ocrjobs.services.submission);
- daphne hands that body over as it is, in the request's scope (``BODY_EXTENSION``): it queues
  one empty message instead of the body's chunks;
- ``FrontASGIHandler`` takes it from the scope as its body file. Django closes it when the
  request ends, as it closes its own spool.
So the multipart parser reads the bytes twisted received, from memory or from one file.

Memory: each request in flight holds at most REQUEST_BODY_MEMORY_BYTES of body (a larger one is
on disk, and no longer passes through daphne's queue). The buffers bodies are read into are kept
for the next bodies, up to REQUEST_BODY_KEEP_BYTES in all (``BodyBuffers``): a fresh buffer's
every page was a page fault and a page the kernel zeroed (and Python zeroed it again), ~20% of the
front's CPU on bench/uploads.py (perf: clear_page_erms).
"""

from __future__ import annotations

import contextlib
import contextvars
import ctypes
import errno
import functools
import io
import sys
import threading

from django.conf import settings
from django.core.exceptions import RequestAborted
from django.core.handlers.asgi import ASGIHandler

BODY_EXTENSION = "fleetadmin.body"
# What twisted reads from the socket at a time on a connection sending a large body (its default,
# 64 KiB, cost a pass through four Python calls for every 64 KiB of an upload).
RECEIVE_BYTES = 1024 * 1024

# What twisted's own reading leaves of a body read into its buffer: the end of the body, which
# twisted's parser sees arrive (and with it anything the client sent after it).
TAIL_BYTES = 64 * 1024

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
    from twisted.internet import tcp

    original_init = protocol.WebRequest.__init__
    original_got_length = protocol.WebRequest.gotLength
    original_received = protocol.WebRequest.requestReceived
    original_create = server.Server.create_application

    def __init__(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        self._parsePOSTFormSubmission = False

    def gotLength(self, length):
        transport = getattr(self.channel, "transport", None)
        if (length is None or length > RECEIVE_BYTES) and transport is not None:
            transport.bufferSize = RECEIVE_BYTES
        if length is not None and length <= settings.REQUEST_BODY_MEMORY_BYTES:
            self.content = BodyInMemory(length)
            reads = getattr(type(transport), "doRead", None)  # none on a test's transport
            if length > TAIL_BYTES and reads is tcp.Connection.doRead and hasattr(transport, "socket"):
                transport.doRead = functools.partial(_read_into, transport, self)
        else:
            original_got_length(self, length)  # a temporary file (a BytesIO under 100 kB)

    def requestReceived(self, command, path, version):
        # The body is in: the connection's next request is read 64 KiB at a time again (twisted's
        # own size) until its length is known. Twisted splits a request's head off what was read
        # one line at a time, copying the rest each time: a 1 MiB read of a head and a body's
        # start cost ~10 copies of 1 MiB per request (perf: bytes_split, 10% of the front's faults).
        transport = getattr(self.channel, "transport", None)
        if transport is not None:
            vars(transport).pop("bufferSize", None)
        return original_received(self, command, path, version)

    def create_application(self, protocol_instance, scope):
        content = getattr(protocol_instance, "content", None)
        if scope.get("type") == "http" and content is not None and not content.closed:
            body = content.file() if isinstance(content, BodyInMemory) else content
            scope.setdefault("extensions", {})[BODY_EXTENSION] = body
            protocol_instance.content = io.BytesIO()  # what daphne queues: one empty message
        return original_create(self, protocol_instance, scope)

    protocol.WebRequest.__init__ = __init__
    protocol.WebRequest.gotLength = gotLength
    protocol.WebRequest.requestReceived = requestReceived
    server.Server.create_application = create_application
    protocol.WebRequest._fleetadmin_bodies = True


def _read_into(transport, request) -> object:
    """The connection's doRead while a body kept in memory arrives: the socket reads straight into
    the body's buffer, and twisted's parser is told how much came (what it counts down). The end
    of the body (TAIL_BYTES) is left to twisted's own doRead, which this hands back to first, as
    it does for anything that is not a body arriving (a pipelined request, a paused parser)."""
    from twisted.internet import main
    from twisted.web.http import _IdentityTransferDecoder

    content, channel = request.content, request.channel
    decoder = getattr(channel, "_transferDecoder", None)
    left = content.left() if isinstance(content, BodyInMemory) else 0
    if (
        left <= TAIL_BYTES
        or not isinstance(decoder, _IdentityTransferDecoder)
        or decoder.contentLength != left
        or getattr(channel, "_handlingRequest", True)
        or getattr(channel, "_buffer", b"")
    ):
        del transport.doRead  # the class's own, from now on
        return transport.doRead()
    try:
        received = content.receive(transport.socket, min(left - TAIL_BYTES, RECEIVE_BYTES))
    except OSError as error:
        return None if error.errno in (errno.EAGAIN, errno.EWOULDBLOCK) else main.CONNECTION_LOST
    if not received:
        return main.CONNECTION_DONE
    decoder.contentLength -= received
    channel.resetTimeout()
    return None


class MemoryReader(io.RawIOBase):
    """A read-only binary file over bytes in memory (a memoryview), copying only what is read: a
    BytesIO would copy the whole file first. What readers of a body or an upload use: read,
    readinto (pypdfium2), seek and tell (Pillow)."""

    def __init__(self, view: memoryview):
        super().__init__()
        self.view = memoryview(view)  # its own, let go of when it is closed
        self._position = 0

    def close(self) -> None:
        super().close()
        with contextlib.suppress(BufferError):  # a reader (PDFium, hashlib) still points into it
            self.view.release()

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        start = min(self._position, len(self.view))
        data = self.view[start : start + len(buffer)]
        buffer[: len(data)] = data
        self._position = start + len(data)
        return len(data)

    def read(self, size: int | None = -1) -> bytes:
        start = min(self._position, len(self.view))
        end = len(self.view) if size is None or size < 0 else min(start + size, len(self.view))
        self._position = end
        return self.view[start:end].tobytes()

    readall = read

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if whence == io.SEEK_CUR:
            offset += self._position
        elif whence == io.SEEK_END:
            offset += len(self.view)
        if offset < 0:
            raise ValueError(f"negative seek position {offset}")
        self._position = offset
        return offset

    def tell(self) -> int:
        return self._position


class BodyStream(io.BufferedReader):
    """A body held in memory as the file Django reads (read, readline, seek), and ``body``: its
    buffer itself, for a parser that reads it in place (ocrjobs.uploads.parse_in_memory)."""

    def __init__(self, body: bytearray):
        super().__init__(MemoryReader(memoryview(body)))
        self.body: bytearray | None = body

    def close(self) -> None:
        super().close()
        self.body = None  # the buffer, free for another body once nothing else points into it (BodyBuffers)


# CPython's own functions: a bytearray of a size, not zeroed (``PyByteArray_FromStringAndSize`` with
# no bytes to copy), and a bytearray resized within what it has allocated: no copy, nothing written.
_bytearray_of_size = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_char_p, ctypes.c_ssize_t)(
    ("PyByteArray_FromStringAndSize", ctypes.pythonapi)
)
_bytearray_resize = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.c_ssize_t)(
    ("PyByteArray_Resize", ctypes.pythonapi)
)
_EMPTY_SIZE = bytearray().__sizeof__()


def _allocated(buffer: bytearray) -> int:
    """The bytes ``buffer`` has allocated (its length and what it can grow to without a copy)."""
    return buffer.__sizeof__() - _EMPTY_SIZE


def _references(buffers: list[bytearray], index: int) -> int:
    return sys.getrefcount(buffers[index])


# The references to a buffer that nothing but BodyBuffers' list holds, as _references counts them.
_KEPT_ONLY = _references([bytearray()], 0)


class BodyBuffers:
    """The buffers bodies are read into, kept for the bodies that follow, up to
    REQUEST_BODY_KEEP_BYTES of them in all (in use or not). A fresh buffer of a body's size was a
    fresh mapping from the kernel, each of its pages a fault and a page zeroed, then zeroed again by
    ``bytearray(length)``, and unmapped when the request ended: ~20% of the front's CPU on
    bench/uploads.py (perf: clear_page_erms, __memset), glibc's tunables did not keep it mapped.

    A kept buffer is free again once nothing but this list refers to it: the request, its files,
    every view of them (a memoryview holds the buffer) gone. References are counted, not handed
    back, so no view of a buffer, wherever it is and however long it lives, ever sees the buffer
    hold another body. A buffer handed out again still holds an earlier body's bytes beyond what
    its new body received: ``BodyInMemory`` shows only what it received."""

    SMALLEST = 1024 * 1024  # a smaller body gets a buffer of its own, from malloc's heap as before
    HEADROOM = 4  # a new kept buffer can grow by 1/4 in place, and serves bodies half its size or more

    def __init__(self) -> None:
        self._kept: list[bytearray] = []
        self._lock = threading.Lock()  # twisted's thread takes them; tests may take them anywhere

    def take(self, length: int) -> bytearray:
        """A buffer of ``length`` bytes, not zeroed: whatever it holds is not this body's until written."""
        if length < self.SMALLEST:
            return bytearray(length)
        with self._lock:
            self._drop_spent()
            buffer = self._free(length)
            if buffer is None:
                buffer = self._new(length)
        _bytearray_resize(buffer, length)
        return buffer

    def kept(self) -> list[bytearray]:
        return list(self._kept)

    def _drop_spent(self) -> None:
        """Let go of the free kept buffers that can serve no body of SMALLEST bytes or more: a body
        cut short shrinks its buffer to what came (``BodyInMemory.file``), and CPython reallocs a
        bytearray shrunk below half its allocation down to its length. Kept, each aborted upload
        left one more entry in the list, every ``take`` walking them all."""
        for index in reversed(range(len(self._kept))):
            if _allocated(self._kept[index]) <= self.SMALLEST and _references(self._kept, index) == _KEPT_ONLY:
                del self._kept[index]

    def _free(self, length: int) -> bytearray | None:
        """The smallest kept buffer free for a body of ``length`` bytes, if one is: CPython's resize
        keeps its allocation for any size from half of it to all of it."""
        best = None
        for index in range(len(self._kept)):
            allocated = _allocated(self._kept[index])
            if allocated // 2 <= length < allocated and _references(self._kept, index) == _KEPT_ONLY:
                if best is None or allocated < _allocated(self._kept[best]):
                    best = index
        return None if best is None else self._kept[best]

    def _new(self, length: int) -> bytearray:
        """A new buffer for ``length`` bytes, kept if there is room (made from the oldest free ones)."""
        allocated = min(length + length // self.HEADROOM, max(length, settings.REQUEST_BODY_MEMORY_BYTES)) + 1
        budget = settings.REQUEST_BODY_KEEP_BYTES - sum(_allocated(buffer) for buffer in self._kept)
        free = [index for index in range(len(self._kept)) if _references(self._kept, index) == _KEPT_ONLY]
        if budget < allocated <= budget + sum(_allocated(self._kept[index]) for index in free):
            dropped = []
            for index in free:
                if budget >= allocated:
                    break
                budget += _allocated(self._kept[index])
                dropped.append(index)
            for index in reversed(dropped):
                del self._kept[index]
        buffer = _bytearray_of_size(None, allocated - 1)
        if budget >= allocated:
            self._kept.append(buffer)
        return buffer


BUFFERS = BodyBuffers()


class BodyInMemory:
    """Twisted's content file for a body of known length kept in memory: one buffer of that length
    (``BodyBuffers``), filled as the body arrives (by the socket itself, ``receive``, or by
    twisted's writes), and read as a file (``BodyStream``, sharing the buffer) once it is in: only
    what arrived, never what the buffer held before."""

    def __init__(self, length: int, buffers: BodyBuffers = BUFFERS) -> None:
        self._buffer = buffers.take(length)
        self._size = 0
        self._file: BodyStream | None = None

    def left(self) -> int:
        """Bytes of the body still to come."""
        return len(self._buffer) - self._size if self._file is None else 0

    def receive(self, sock, size: int) -> int:
        """Read up to ``size`` bytes of the body from the socket into the buffer; how many came."""
        with memoryview(self._buffer) as view:
            received = sock.recv_into(view[self._size : self._size + size])
        self._size += received
        return received

    def write(self, data: bytes) -> int:
        if self._file is not None:
            raise ValueError("the body was read already")
        end = self._size + len(data)
        if end > len(self._buffer):  # more than its Content-Length said (twisted never passes that on)
            self._buffer.extend(bytes(end - len(self._buffer)))
        self._buffer[self._size : end] = data
        self._size = end
        return len(data)

    def tell(self) -> int:
        return self._size if self._file is None else self._file.tell()

    @property
    def closed(self) -> bool:
        return self._file is not None and self._file.closed

    def file(self) -> BodyStream:
        """The body as one file, at the position written to."""
        if self._file is None:
            if self._size < len(self._buffer):
                del self._buffer[self._size :]  # cut short (a connection lost): what came, nothing more
            self._file = BodyStream(self._buffer)
            self._buffer = None  # the file's now: let go of with it
            self._file.seek(self._size)
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
