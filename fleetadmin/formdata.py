"""Multipart form bodies read as they arrive, by python-multipart's streaming parser: each file is
written to a temporary file of its own and hashed on the way, each field set aside; once the body
is whole, Django's ``request.POST`` and ``request.FILES``.

The front (fleetadmin/front.py) feeds a body to a ``FormData`` as Twisted receives it, in place of
Twisted's temporary file of the whole body, so an upload's bytes are received, hashed and written
once. Before, the body went to that temporary file, Django's parser read it back 64 KiB at a time,
copied each chunk three or four times and wrote every file out again: bench/uploads.py measured
the front at 5.8-6.9 ms of CPU a MB (4.5-5.4 s for its 785 MB), 3.0-3.4 ms at 8db2974, whose
front held bodies in its own buffers. Any other server, and Django's test client, feed a
``FormData`` from the request's stream (ocrjobs/uploads.py, through Django's documented
upload-handler hook ``handle_raw_input``): one parser reads every multipart body.

Django's parser's bounds hold: DATA_UPLOAD_MAX_NUMBER_FIELDS (TooManyFieldsSent),
DATA_UPLOAD_MAX_NUMBER_FILES (TooManyFilesSent), DATA_UPLOAD_MAX_MEMORY_SIZE over the fields
(RequestDataTooBig), 1,024 bytes of headers a part (MultiPartParserError). A body that arrives
holds at most FIELDS_IN_MEMORY_BYTES of fields in memory (more spills to a temporary file) and
one open file, the part being written; the first error stops the parse, removes what was written
and is raised when the view reads the form.
"""

from __future__ import annotations

import contextvars
import hashlib
import os
import re
import tempfile
import threading
import urllib.parse

from django.conf import settings
from django.core.exceptions import RequestDataTooBig, TooManyFieldsSent, TooManyFilesSent
from django.core.files.uploadedfile import UploadedFile
from django.http import QueryDict
from django.http.multipartparser import MultiPartParserError
from django.utils.datastructures import MultiValueDict
from django.utils.http import parse_header_parameters
from python_multipart import MultipartParser

# A part's headers, all of them together: as much as Django's parser reads for them.
MAX_PART_HEADER_BYTES = 1024
# The fields of a body that is still arriving kept in memory up to this, spilled to a temporary
# file past it: what Twisted kept of a whole body (100 kB) before this parser read them.
FIELDS_IN_MEMORY_BYTES = 100 * 1024
# The boundaries Django's parser takes (MultiPartParser.boundary_re).
BOUNDARY_RE = re.compile(r"[ -~]{0,200}[!-~]")

# The body the front read as it arrived, for the request being handled (fleetadmin.asgi sets it).
received: contextvars.ContextVar[FormData | None] = contextvars.ContextVar("received_form", default=None)

_REFUSALS = (MultiPartParserError, RequestDataTooBig, TooManyFieldsSent, TooManyFilesSent)


class ReceivedFile(UploadedFile):
    """An uploaded file as a FormData wrote it: a temporary file, moved into place by whoever keeps
    it (``temporary_file_path``, as Django's TemporaryUploadedFile), removed on close otherwise."""

    def __init__(self, path: str, *, sha256: str, **kwargs) -> None:
        super().__init__(open(path, "rb"), **kwargs)  # (closed by close())
        self.path = path
        self.sha256 = sha256

    def temporary_file_path(self) -> str:
        return self.path

    def close(self) -> None:
        self.file.close()
        _remove(self.path)


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass  # (moved into place)


def _file_name(name: str) -> str | None:
    """A part's file name without directories or characters that do not print; None for one that
    names nothing (Django's parser's rules)."""
    name = name.rsplit("/")[-1].rsplit("\\")[-1]
    name = "".join(char for char in name if char.isprintable())
    return None if name in {"", ".", ".."} else name


class FormData:
    """A multipart/form-data body, written to as it arrives (``write``), read as Django's POST and
    FILES once it is whole (``finish``). Also the request's body file for Django: it reads empty."""

    def __init__(self, boundary: bytes) -> None:
        callbacks = {name[1:]: getattr(self, name) for name in dir(type(self)) if name.startswith("_on_")}
        self._parser = MultipartParser(boundary, callbacks, max_header_size=MAX_PART_HEADER_BYTES)
        self._fields = tempfile.SpooledTemporaryFile(max_size=FIELDS_IN_MEMORY_BYTES)
        self._field_spans: list[tuple[str, int, int]] = []  # (name, start, end) in self._fields
        self._parts: list[tuple[str, str, dict]] = []  # (field name, path, ReceivedFile's arguments)
        self._lock = threading.Lock()  # the front's thread writes and closes, a view's finishes
        self._error: Exception | None = None
        self._ended = self._taken = self.closed = False
        self._field_bytes = self._field_count = self._file_count = 0
        self._new_part()

    @classmethod
    def for_content_type(cls, content_type: str) -> FormData | None:
        """A FormData for a body of this Content-Type, or None if it is not multipart/form-data
        with a boundary Django's parser would take (Django then answers it as it always has)."""
        kind, params = parse_header_parameters(content_type)
        boundary = params.get("boundary", "")
        if kind != "multipart/form-data" or not BOUNDARY_RE.fullmatch(boundary):
            return None
        return cls(boundary.encode("ascii"))

    # --- the body, as it arrives --------------------------------------------------------------

    def write(self, data: bytes) -> int:
        with self._lock:
            if self._error is None and not self.closed:
                try:
                    self._parser.write(data)
                except Exception as exc:  # the parser's, the limits', the disk's
                    self._fail(exc)
        return len(data)

    def finish(self, encoding: str | None = None) -> tuple[QueryDict, MultiValueDict]:
        """The form's fields and files, once the whole body was written; the first error the body
        met is raised instead. The files are the caller's from then on (request.close closes them)."""
        encoding = encoding or settings.DEFAULT_CHARSET
        with self._lock:
            if self.closed:
                raise MultiPartParserError("the request was closed before its form was read")
            if self._error is None and not self._ended:
                self._fail(MultiPartParserError("the multipart body ended before its closing boundary"))
            if self._error is not None:
                raise self._error
            self._taken = True
            pairs = []
            for name, start, end in self._field_spans:
                self._fields.seek(start)
                pairs.append((name, self._fields.read(end - start).decode(encoding, errors="replace")))
            self._fields.close()
            files = MultiValueDict()
            for name, path, kwargs in self._parts:
                files.appendlist(name, ReceivedFile(path, **kwargs))
            # (a QueryDict read from its query string: immutable, as Django's parser leaves POST)
            query = urllib.parse.urlencode(pairs, encoding=encoding, errors="replace")
            return QueryDict(query, encoding=encoding), files

    # The file-like side Twisted and Django see: the body's bytes are in the form, not here.
    def read(self, size: int = -1) -> bytes:
        return b""

    def seek(self, offset: int, whence: int = 0) -> int:
        return 0

    def tell(self) -> int:
        return 0

    def close(self) -> None:
        """Remove what was written unless ``finish`` handed it over (the connection was lost, the
        body refused, or the view never read the form)."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
            if not self._taken:
                self._discard()

    # --- what the parser found ----------------------------------------------------------------

    def _new_part(self) -> None:
        self._headers: dict[str, str] = {}
        self._header_name = bytearray()
        self._header_value = bytearray()
        self._header_bytes = 0
        self._name: str | None = None  # the part's field name; None: a part that is skipped
        self._file = None  # the file part being written
        self._path = ""
        self._file_arguments: dict = {}
        self._digest = None
        self._size = 0
        self._start = 0

    def _on_part_begin(self) -> None:
        self._new_part()

    def _on_header_field(self, data: bytes, start: int, end: int) -> None:
        self._count_header_bytes(end - start)
        self._header_name += data[start:end]

    def _on_header_value(self, data: bytes, start: int, end: int) -> None:
        self._count_header_bytes(end - start)
        self._header_value += data[start:end]

    def _count_header_bytes(self, count: int) -> None:
        self._header_bytes += count
        if self._header_bytes > MAX_PART_HEADER_BYTES:
            raise MultiPartParserError("Request max total header size exceeded.")

    def _on_header_end(self) -> None:
        name = self._header_name.decode("latin-1").strip().lower()
        self._headers[name] = self._header_value.decode("utf-8", errors="replace").strip()
        self._header_name, self._header_value = bytearray(), bytearray()

    def _on_headers_finished(self) -> None:
        kind, disposition = parse_header_parameters(self._headers.get("content-disposition", ""))
        if not kind or "name" not in disposition:
            return  # (no field name: skipped, as Django's parser skips it)
        if "content-transfer-encoding" in self._headers:
            raise MultiPartParserError("a part has a Content-Transfer-Encoding, which form data never has (RFC 7578)")
        self._name = disposition["name"].strip()
        if not disposition.get("filename"):
            self._field_count += 1
            limit = settings.DATA_UPLOAD_MAX_NUMBER_FIELDS
            if limit is not None and self._field_count > limit:
                raise TooManyFieldsSent(
                    "The number of GET/POST parameters exceeded settings.DATA_UPLOAD_MAX_NUMBER_FIELDS."
                )
            self._count_field_bytes(len(self._name.encode()) + 2)  # (as Django counts a field: its name and '&=')
            self._fields.seek(0, os.SEEK_END)
            self._start = self._fields.tell()
            return
        self._file_count += 1
        limit = settings.DATA_UPLOAD_MAX_NUMBER_FILES
        if limit is not None and self._file_count > limit:
            raise TooManyFilesSent("The number of files exceeded settings.DATA_UPLOAD_MAX_NUMBER_FILES.")
        file_name = _file_name(disposition["filename"])
        if file_name is None:  # (Django's parser drops the part, then fails to read on: said here)
            raise MultiPartParserError(f"the file name {disposition['filename'][:40]!r} names no file")
        content_type, extra = parse_header_parameters(self._headers.get("content-type", ""))
        extra = {key: value.encode() for key, value in extra.items()}  # (bytes, as Django's parser gives them)
        self._file_arguments = {"name": file_name, "content_type": content_type, "charset": extra.get("charset"),
                                "content_type_extra": extra}  # fmt: skip
        fd, self._path = tempfile.mkstemp(suffix=".upload", dir=settings.FILE_UPLOAD_TEMP_DIR)
        self._file = os.fdopen(fd, "wb")
        self._digest = hashlib.sha256()

    def _on_part_data(self, data: bytes, start: int, end: int) -> None:
        if self._name is None:
            return
        chunk = memoryview(data)[start:end]
        if self._file is not None:
            self._digest.update(chunk)
            self._file.write(chunk)
            self._size += len(chunk)
        else:
            self._count_field_bytes(len(chunk))
            self._fields.write(chunk)

    def _count_field_bytes(self, count: int) -> None:
        self._field_bytes += count
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        if limit is not None and self._field_bytes > limit:
            raise RequestDataTooBig("Request body exceeded settings.DATA_UPLOAD_MAX_MEMORY_SIZE.")

    def _on_part_end(self) -> None:
        if self._name is None:
            return
        if self._file is None:
            self._field_spans.append((self._name, self._start, self._fields.tell()))
            return
        self._file.close()
        self._parts.append((self._name, self._path, {**self._file_arguments, "size": self._size,
                                                     "sha256": self._digest.hexdigest()}))  # fmt: skip
        self._file = None

    def _on_end(self) -> None:
        self._ended = True

    # --- failures -----------------------------------------------------------------------------

    def _fail(self, exc: Exception) -> None:
        self._error = exc if isinstance(exc, _REFUSALS) else MultiPartParserError(f"the multipart body: {exc}")
        self._discard()

    def _discard(self) -> None:
        if self._file is not None:
            self._file.close()
            _remove(self._path)
            self._file = None
        for _, path, _ in self._parts:
            _remove(path)
        self._parts = []
        self._fields.close()
