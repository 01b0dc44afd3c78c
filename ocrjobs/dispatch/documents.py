"""A document's body on its way to a pod (``PUT /v1/documents/{sha256}``).

A document on this host's filesystem goes from the page cache to the socket in the kernel
(``sendfile``): the dispatcher neither reads it into memory nor copies it through Python. Read
whole and written by aiohttp, the 786 MB of the ingest benchmark were a quarter of the dispatch
loop's CPU. A document in object storage is read whole, as before (``document_bytes``).
"""

from __future__ import annotations

import asyncio
import os
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
        return FileBody(file, os.fstat(file.fileno()).st_size), file
    except BaseException:
        file.close()
        raise
