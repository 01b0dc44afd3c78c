"""Documents' PUTs to pods: what a PUT sends for a stored document, and the gate that bounds the
bytes of documents on their way at once (the routing that asks for them: documents.py).

A dispatcher sends at most DISPATCH_DOCUMENT_BYTES_IN_FLIGHT of documents at once
(``DocumentGate``), first asked first sent: a document read whole (TLS) is in memory a few at a
time, not one copy per pod that asked, and the first pods start reading while the others' copies
are on their way. (One 5.2 MB document sent to 256 pods at once: every lane's first page at 4.9 s
against the ideal 2.0; 16 or 64 MiB at a time: 3.9 and 4.0 s.)

A document on this host's filesystem goes from the page cache to the socket in the kernel
(``sendfile``): the dispatcher neither reads it into memory nor copies it through Python. Read
whole and written by aiohttp, the 786 MB of the ingest benchmark were a quarter of the dispatch
loop's CPU. A document in object storage is read whole, as before (``document_bytes``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections import deque
from collections.abc import AsyncIterator
from typing import Any, BinaryIO

from aiohttp.payload import Payload

from ocrjobs.storage import document_bytes, document_file


class FileBody(Payload):
    """An open file sent by ``loop.sendfile`` once aiohttp has written the request's headers (and
    a Content-Length, from ``size``). The caller closes the file once the request is over."""

    def __init__(self, file: BinaryIO, size: int, **kwargs: Any):
        super().__init__(file, content_type="application/octet-stream", **kwargs)
        self._size = size

    async def write(self, writer) -> None:
        await self.write_with_length(writer, None)

    async def write_with_length(self, writer, content_length: int | None) -> None:
        count = self._size if content_length is None else min(self._size, content_length)
        writer.send_headers()  # aiohttp holds them back to go out with the first chunk of a body
        await asyncio.get_running_loop().sendfile(writer.transport, self._value, 0, count)

    def decode(self, encoding: str = "utf-8", errors: str = "strict") -> str:
        raise TypeError("a document's body is not text")


def document_body(source: str, *, sendfile: bool = True) -> tuple[FileBody | bytes, BinaryIO | None]:
    """What a PUT sends for the stored document ``source``, and the file to close after it (None:
    bytes read whole). ``sendfile`` False (a TLS connection, which the kernel cannot encrypt):
    read whole. Blocking (it opens or reads the file): run it off the loop."""
    file = document_file(source) if sendfile else None
    if file is None:
        return document_bytes(source), None
    try:
        size = os.fstat(file.fileno()).st_size
        _into_page_cache(file, size)
        return FileBody(file, size), file
    except BaseException:
        file.close()
        raise


def _into_page_cache(file: BinaryIO, size: int) -> None:
    """Read the file into the page cache here, off the loop, so that the loop's sendfile only
    copies from memory: an upload may have left the cache since it was stored, and a sendfile of a
    file not in it waits for the disk inside the loop (2.4-2.6 ms per 3.6 MB document on this
    machine, 0.3 ms cached). A sendfile to /dev/null reads the pages in and copies nothing."""
    with open(os.devnull, "wb") as null:
        sent = 0
        while sent < size:
            count = os.sendfile(null.fileno(), file.fileno(), sent, size - sent)
            if count == 0:  # the file got shorter: the PUT sends what is there
                return
            sent += count


class DocumentWaited(Exception):
    """A document waited for room at the gate longer than its deadline: nothing reached the pod."""


class DocumentGate:
    """At most ``limit`` bytes of documents on their way at once, first come first served: a
    document waits while the ones ahead of it, or the bytes out now, leave no room (one larger
    than ``limit`` goes alone, once nothing else is out), and no longer than ``within`` seconds
    (DocumentWaited): each PUT ahead of it has a deadline, but many of them add up."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0
        self._waiting: deque[tuple[int, asyncio.Future]] = deque()

    @contextlib.asynccontextmanager
    async def room(self, size: int, *, within: float | None = None) -> AsyncIterator[None]:
        size = max(size, 1)
        if self._waiting or not self._fits(size):
            turn = asyncio.get_running_loop().create_future()
            entry = (size, turn)
            self._waiting.append(entry)
            try:
                async with asyncio.timeout(within):
                    await turn
            except BaseException as exc:
                if entry in self._waiting:
                    self._waiting.remove(entry)
                    self._admit()  # (the ones behind it may fit now)
                elif turn.done() and not turn.cancelled():
                    self._leave(size)  # (given room, then cancelled before it took it)
                if isinstance(exc, TimeoutError):
                    raise DocumentWaited(f"no room for the document within {within:g} s") from exc
                raise
        else:
            self.held += size
        try:
            yield
        finally:
            self._leave(size)

    def _fits(self, size: int) -> bool:
        return self.held == 0 or self.held + size <= self.limit

    def _leave(self, size: int) -> None:
        self.held -= size
        self._admit()

    def _admit(self) -> None:
        while self._waiting:
            size, turn = self._waiting[0]
            if turn.done():  # (cancelled, its clean-up still to run: it finds itself out of line)
                self._waiting.popleft()
                continue
            if not self._fits(size):
                return
            self._waiting.popleft()
            self.held += size
            turn.set_result(None)
