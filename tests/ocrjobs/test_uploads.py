"""The plain multipart body parsed from memory (ocrjobs/uploads.py): for every body it takes, the
same fields and files as Django's parser makes from it; every other body is left to Django's parser
untouched (nothing read, no file left behind)."""

from __future__ import annotations

import hashlib
import io
import os

import httpx
import pytest
from django.core.files.uploadedfile import UploadedFile
from django.core.handlers.asgi import ASGIRequest

from fleetadmin.bodies import BodyStream
from ocrjobs.uploads import BodyFile, parse_in_memory

BOUNDARY = "b0undary-4e1f"


def _request(body: bytes, *, content_type: str = f"multipart/form-data; boundary={BOUNDARY}", length=None,
             held: str = "bytes"):  # fmt: skip
    """A request over ``body`` held as bytes (BytesIO: the test client) or, ``held="buffer"``, in a
    buffer of the front's (fleetadmin.bodies.BodyStream over a bytearray)."""
    headers = [(b"content-type", content_type.encode()), (b"content-length", str(length or len(body)).encode())]
    scope = {"type": "http", "method": "POST", "path": "/v1/jobs", "query_string": b"", "headers": headers}
    return ASGIRequest(scope, BodyStream(bytearray(body)) if held == "buffer" else io.BytesIO(body))


def _part(headers: list[str], data: bytes) -> bytes:
    return f"--{BOUNDARY}\r\n".encode() + "\r\n".join(headers).encode() + b"\r\n\r\n" + data + b"\r\n"


def _body(*parts: bytes, end: bytes = b"\r\n") -> bytes:
    return b"".join(parts) + f"--{BOUNDARY}--".encode() + end


def _file(name: str, data: bytes, content_type: str | None = "application/pdf", field: str = "files") -> bytes:
    headers = [f'Content-Disposition: form-data; name="{field}"; filename="{name}"']
    if content_type is not None:
        headers.append(f"Content-Type: {content_type}")
    return _part(headers, data)


def _field(name: str, value: bytes) -> bytes:
    return _part([f'Content-Disposition: form-data; name="{name}"'], value)


def _shown(request) -> tuple[dict, list]:
    """The fields, and what a reader of each file sees (an UploadedFile of Django's kind: in memory or
    spooled to a temporary file, and for this parser a view of the body: ocrjobs.uploads.BodyFile)."""
    files = []
    for field, uploaded in request.FILES.lists():
        for f in uploaded:
            assert isinstance(f, UploadedFile)
            f.seek(0)
            data = f.read()
            files.append((field, f.name, f.content_type, f.charset, f.content_type_extra,
                          f.size, data, getattr(f, "sha256", None) or hashlib.sha256(data).hexdigest()))  # fmt: skip
    return dict(request.POST.lists()), files


BIG = os.urandom(3 * 1024 * 1024)  # two of these make a body over FILE_UPLOAD_MAX_MEMORY_SIZE: temporary files

TAKEN = {
    "fields and small files (in memory)": _body(
        _field("pool", b"local"), _file("a.pdf", b"%PDF-1 small"), _file("b.png", b"\x89PNG small", "image/png")
    ),
    "large files (spooled, hashed)": _body(_file("a.pdf", BIG), _file("b.pdf", BIG[::-1]), _field("languages", b"eng")),
    "no content type": _body(_file("scan.jpg", b"\xff\xd8\xff jpeg", None)),
    "a content type with a charset": _body(_file("t.tif", b"II*\x00 tiff", "image/tiff; charset=latin-1")),
    "a path in the file name": _body(_file("../../etc/passwd.pdf", b"%PDF-")),
    "an entity in the file name": _body(_file("a&amp;b.pdf", b"%PDF-")),
    "an RFC 2231 file name": _body(
        _part(["Content-Disposition: form-data; name=\"files\"; filename*=UTF-8''%C3%A9t%C3%A9.pdf"], b"%PDF-")
    ),
    "a field sent twice, an unknown field": _body(
        _field("urls", b"https://a/1"), _field("urls", b"x"), _field("z", b"")
    ),
    "a field of invalid UTF-8": _body(_field("languages", b"eng\xff")),
    "no CRLF after the closing boundary": _body(_file("a.pdf", b"%PDF-"), end=b""),
}


@pytest.mark.parametrize("held", ["bytes", "buffer"])
@pytest.mark.parametrize("body", TAKEN.values(), ids=TAKEN.keys())
def test_a_plain_body_gives_the_fields_and_files_djangos_parser_gives(body, held, settings):
    fast, django = _request(body, held=held), _request(body)

    assert parse_in_memory(fast)

    assert _shown(fast) == _shown(django)


def test_the_files_of_a_body_in_memory_are_views_of_it_and_no_temporary_file(tmp_path, settings):
    spool = tmp_path / "spool"
    spool.mkdir()
    settings.FILE_UPLOAD_TEMP_DIR = str(spool)
    body = _body(_file("a.pdf", BIG), _file("b.pdf", BIG[::-1]))  # Django's parser would spool both
    request = _request(body)

    assert parse_in_memory(request)

    files = request.FILES.getlist("files")
    assert [type(f) for f in files] == [BodyFile, BodyFile]
    assert [f.view.obj for f in files] == [body, body]  # the body's own bytes, not a copy
    assert [f.view.tobytes() for f in files] == [BIG, BIG[::-1]]
    assert [f.sha256 for f in files] == [hashlib.sha256(BIG).hexdigest(), hashlib.sha256(BIG[::-1]).hexdigest()]
    assert list(spool.iterdir()) == []


def test_httpx_uploads_are_plain(settings):
    files = [("files", (f"scan-{n}.pdf", BIG + bytes([n]), "application/octet-stream")) for n in range(3)]
    sent = httpx.Request("POST", "http://front/v1/jobs", files=files, data={"pool": "ingest"})
    body = sent.read()
    fast, django = (
        _request(body, content_type=sent.headers["content-type"]),
        _request(body, content_type=sent.headers["content-type"]),
    )

    assert parse_in_memory(fast)

    assert _shown(fast) == _shown(django)
    assert [f.sha256 for f in fast.FILES.getlist("files")] == [hashlib.sha256(d).hexdigest() for _, (_, d, _) in files]


DECLINED = {
    "the boundary's bytes without CRLF inside a file": _body(_file("a.pdf", b"%PDF- x--b0undary-4e1fy")),
    "base64 transfer encoding": _body(
        _part(
            ['Content-Disposition: form-data; name="files"; filename="a.pdf"', "Content-Transfer-Encoding: base64"],
            b"JVBERi0=",
        )  # fmt: skip
    ),
    "a file name of only dots": _body(_file("..", b"%PDF-")),
    "an empty file name": _body(_file("", b"%PDF-")),
    "an empty file": _body(_file("a.pdf", b"")),
    "a preamble": b"preamble\r\n" + _body(_file("a.pdf", b"%PDF-")),
    "no closing boundary": _file("a.pdf", b"%PDF-"),
    "an epilogue": _body(_file("a.pdf", b"%PDF-"), end=b"\r\nmore"),
    "another header": _body(
        _part(['Content-Disposition: form-data; name="files"; filename="a.pdf"', "Content-Length: 5"], b"%PDF-")
    ),  # fmt: skip
    "a header twice": _body(_part(['Content-Disposition: form-data; name="a"'] * 2, b"x")),
    "no content disposition": _body(_part(["Content-Type: text/plain"], b"x")),
    "a disposition other than form-data": _body(_part(['Content-Disposition: attachment; name="a"'], b"x")),
    "a field with a content type": _body(
        _part(['Content-Disposition: form-data; name="a"', "Content-Type: text/plain"], b"x")
    ),  # fmt: skip
    "a name with spaces around it": _body(_field(" pool ", b"local")),
    "a non-ASCII header": _body(_file("été.pdf", b"%PDF-")),
    "bare LF line ends": _body(_file("a.pdf", b"%PDF-")).replace(b"\r\n", b"\n"),
    "a part ending without CRLF before the boundary": _body(_field("a", b"x"))[: -len(f"\r\n--{BOUNDARY}--\r\n")]
    + f"\n--{BOUNDARY}--\r\n".encode(),
    "headers over 1024 bytes": _body(_part([f'Content-Disposition: form-data; name="{"n" * 1100}"'], b"x")),
}


@pytest.mark.parametrize("held", ["bytes", "buffer"])
@pytest.mark.parametrize("body", DECLINED.values(), ids=DECLINED.keys())
def test_any_other_body_is_left_to_djangos_parser_untouched(body, held, tmp_path, settings):
    spool = tmp_path / "spool"
    spool.mkdir()
    settings.FILE_UPLOAD_TEMP_DIR = str(spool)
    request = _request(body, held=held)

    assert not parse_in_memory(request)

    assert request._stream.tell() == 0 and not request._read_started
    assert not hasattr(request, "_files")
    assert list(spool.iterdir()) == []


def test_a_body_near_a_limit_is_left_to_djangos_parser(settings, tmp_path):
    spool = tmp_path / "spool"
    spool.mkdir()
    settings.FILE_UPLOAD_TEMP_DIR = str(spool)
    two_files = _body(_file("a.pdf", BIG), _file("b.pdf", BIG))
    settings.DATA_UPLOAD_MAX_NUMBER_FILES = 1
    assert not parse_in_memory(_request(two_files))
    assert list(spool.iterdir()) == []  # the first file, spooled already, is removed

    settings.DATA_UPLOAD_MAX_NUMBER_FILES = 100
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 100
    assert not parse_in_memory(_request(_body(_field("urls", b"x" * 200))))

    settings.DATA_UPLOAD_MAX_NUMBER_FIELDS = 2
    assert not parse_in_memory(_request(_body(*[_field("urls", b"x")] * 3)))


def test_a_body_not_in_memory_or_of_another_length_or_type_is_left_to_djangos_parser():
    body = _body(_file("a.pdf", b"%PDF-"))
    on_disk = _request(body)
    on_disk._stream = io.BufferedReader(io.BytesIO(body))

    assert not parse_in_memory(on_disk)
    assert not parse_in_memory(_request(body, length=len(body) + 1))
    assert not parse_in_memory(_request(body, content_type="multipart/mixed; boundary=" + BOUNDARY))
    assert not parse_in_memory(_request(body, content_type='multipart/form-data; boundary=""'))
