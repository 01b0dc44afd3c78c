"""Uploads: an upload handler that hashes each file as Django spools it to disk (the sha256 pods
cache a document under costs no second read of its bytes: ocrjobs.services.submission._stage),
and the plain multipart body of ``POST /v1/jobs`` parsed from memory.

Django's MultiPartParser reads a body 64 KiB at a time and copies each chunk three or four times
on its way to a handler; its own work was ~40% of the front's CPU on bench/ingest.py beside the
hashing and writing it feeds. A body the front keeps in memory (fleetadmin/bodies.py) is parsed
here instead, straight from its buffer: each file is a view of its bytes where they lie in the
body (``BodyFile``: nothing copied, no temporary file), hashed once. The submission writes it once,
to its name in the documents' storage (ocrjobs.storage.document_store_memory). Only the plain
shape is (what clients and browsers send: form-data parts with a name, files with a file name and
perhaps a content type, nothing else); anything else, and any limit a body comes near, is left to
Django's parser, which answers as it always has. tests/ocrjobs/test_uploads.py shows both parsers
give the same fields and files (names, types, bytes) for every body this one takes.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import io

from django.conf import settings
from django.core.files.uploadedfile import InMemoryUploadedFile
from django.core.files.uploadhandler import MemoryFileUploadHandler, TemporaryFileUploadHandler
from django.http import HttpRequest, QueryDict
from django.http.multipartparser import MultiPartParser
from django.utils.datastructures import MultiValueDict
from django.utils.http import parse_header_parameters

from fleetadmin.bodies import BodyStream, MemoryReader

MAX_HEADER_BYTES = 1024  # of a part's headers: Django's parser reads them 1024 bytes at a time

# The C library's memmem: a part's end found 4x faster than bytes.find finds it in a body out of
# the CPU's caches (0.10 CPU-s against 0.44 over the 819 MB of 70 bench/ingest.py bodies).
_memmem = ctypes.CDLL(None).memmem
_memmem.restype = ctypes.c_void_p
_memmem.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_size_t]


class HashingTemporaryFileUploadHandler(TemporaryFileUploadHandler):
    def new_file(self, *args, **kwargs) -> None:
        super().new_file(*args, **kwargs)
        self.digest = hashlib.sha256()

    def receive_data_chunk(self, raw_data: bytes, start: int) -> None:
        self.digest.update(raw_data)
        super().receive_data_chunk(raw_data, start)

    def file_complete(self, file_size: int):
        uploaded = super().file_complete(file_size)
        uploaded.sha256 = self.digest.hexdigest()
        return uploaded


class _NotPlain(Exception):
    """The body is not the plain shape: Django's parser reads it."""


def parse_in_memory(request: HttpRequest) -> bool:
    """Set ``request.POST`` and ``request.FILES`` from a plain multipart body held in memory, and
    answer True; False (nothing done) for any other body, which Django's parser then reads."""
    stream = getattr(request, "_stream", None)
    if (
        not isinstance(stream, BodyStream | io.BytesIO)
        or stream.closed
        or request._read_started
        or hasattr(request, "_files")
    ):
        return False
    handlers = request.upload_handlers
    if [type(h) for h in handlers] != [MemoryFileUploadHandler, HashingTemporaryFileUploadHandler]:
        return False
    try:
        length = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        return False
    # The body itself: the front's buffer (fleetadmin/bodies.py), or the bytes a BytesIO shares.
    body = stream.body if isinstance(stream, BodyStream) else stream.getvalue()
    if length != len(body) or request.encoding or settings.DEFAULT_CHARSET.lower() != "utf-8":
        return False
    files = MultiValueDict()
    try:
        post = _parse(body, _boundary(request.META.get("CONTENT_TYPE", "")), files)
    except _NotPlain:
        return False
    stream.seek(len(body))
    request._read_started = True  # as Django's parser leaves it: the body was read
    request._post, request._files = post, files
    return True


def _boundary(content_type: str) -> bytes:
    if not content_type.startswith("multipart/form-data") or not content_type.isascii():
        raise _NotPlain
    boundary = parse_header_parameters(content_type)[1].get("boundary")
    if not boundary or not MultiPartParser.boundary_re.fullmatch(boundary):
        raise _NotPlain
    return boundary.encode("ascii")


def _parse(body: bytes | bytearray, boundary: bytes, files: MultiValueDict) -> QueryDict:
    separator = b"--" + boundary
    if not body.startswith(separator + b"\r\n"):
        raise _NotPlain
    post = QueryDict(mutable=True)
    field_bytes = field_count = file_count = 0
    view = memoryview(body)
    # Where the body lies, for memmem: held by ``anchor`` (a bytearray cannot move or shrink under it).
    anchor = ctypes.c_char.from_buffer(body) if isinstance(body, bytearray) else ctypes.c_char_p(body)
    base = ctypes.addressof(anchor) if isinstance(body, bytearray) else ctypes.cast(anchor, ctypes.c_void_p).value
    position = len(separator) + 2
    while True:
        # Where Django's parser ends the part too: body.find(separator, position), in C.
        found = _memmem(base + position, len(body) - position, separator, len(separator))
        following = -1 if found is None else found - base
        headers_end = body.find(b"\r\n\r\n", position, min(following, position + MAX_HEADER_BYTES))
        if following < 0 or headers_end < 0 or body[following - 2 : following] != b"\r\n":
            raise _NotPlain
        name, file_name, content_type = _part_headers(body[position:headers_end])
        start, end = headers_end + 4, following - 2
        if file_name is None:
            field_count += 1
            field_bytes += end - start + len(name) + 2  # as Django counts them
            if field_count > min(settings.DATA_UPLOAD_MAX_NUMBER_FIELDS or 100, 100) or field_bytes > min(
                settings.DATA_UPLOAD_MAX_MEMORY_SIZE or 2**20, 2**20
            ):
                raise _NotPlain  # near a limit: Django's parser says which
            post.appendlist(name, body[start:end].decode("utf-8", errors="replace"))
        else:
            file_count += 1
            if end <= start or file_count > (settings.DATA_UPLOAD_MAX_NUMBER_FILES or 2**31):
                raise _NotPlain
            files.appendlist(name, BodyFile(view[start:end], name, file_name, *content_type))
        position = following + len(separator)
        if body[position : position + 2] == b"--" and body[position + 2 :] in (b"", b"\r\n"):
            break
        if body[position : position + 2] != b"\r\n":
            raise _NotPlain
        position += 2
    post._mutable = False
    return post


def _part_headers(raw: bytes) -> tuple[str, str | None, tuple[str, dict]]:
    """(field name, sanitized file name or None for a field, (content type, its parameters)) of a
    part whose headers are a form-data Content-Disposition and perhaps a Content-Type, nothing else."""
    headers = {}
    for line in raw.split(b"\r\n"):
        try:
            main, params = parse_header_parameters(line.decode("ascii"))
            header, value = main.split(":", 1)
        except ValueError:
            raise _NotPlain from None
        if header in headers or header not in ("content-disposition", "content-type"):
            raise _NotPlain
        headers[header] = value.strip(), params
    disposition, params = headers.get("content-disposition", ("", {}))
    name = params.get("name", "")
    if disposition != "form-data" or not name or name != name.strip() or set(params) - {"name", "filename"}:
        raise _NotPlain
    if "filename" not in params:
        if "content-type" in headers:
            raise _NotPlain
        return name, None, ("", {})
    file_name = MultiPartParser.sanitize_file_name(None, params["filename"])
    if not file_name:
        raise _NotPlain  # Django's parser skips such a part, and what follows it depends on its bytes
    content_type, extra = headers.get("content-type", ("", {}))
    return name, file_name, (content_type, {key: value.encode() for key, value in extra.items()})


class BodyFile(InMemoryUploadedFile):
    """A file of a body held in memory: ``view``, its bytes where they lie in the body (no copy),
    and ``sha256``, their hash (the name pods cache the document under), taken as it was parsed."""

    def __init__(self, view: memoryview, field_name: str, name: str, content_type: str, extra: dict):
        charset = extra.get("charset")
        super().__init__(MemoryReader(view), field_name, name, content_type, len(view), charset, extra)
        self.view = view
        self.sha256 = hashlib.sha256(view).hexdigest()  # hashlib lets go of the GIL for large buffers

    def close(self) -> None:
        """Django closes a request's files when it ends: the view let go of with it, the body's
        buffer is free for another body (fleetadmin.bodies.BodyBuffers) even while the request
        itself waits for the garbage collector (it is in reference cycles: ``request.user``)."""
        super().close()
        with contextlib.suppress(BufferError):  # something still reads it: it holds the buffer
            self.view.release()
