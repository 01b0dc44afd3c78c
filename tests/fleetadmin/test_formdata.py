"""Multipart form bodies read as they arrive (fleetadmin/formdata.py): each file written once to a
temporary file of its own and hashed on the way, the fields set aside; Django's parser's bounds
kept, and nothing left on disk by a body that is refused or never read."""

from __future__ import annotations

import hashlib
import os

import httpx
import pytest
from django.core.exceptions import RequestDataTooBig, TooManyFieldsSent, TooManyFilesSent
from django.http.multipartparser import MultiPartParserError

from fleetadmin.formdata import FIELDS_IN_MEMORY_BYTES, MAX_PART_HEADER_BYTES, FormData


def _body(files: list, data: dict | None = None) -> tuple[str, bytes]:
    if not files:  # (httpx sends fields alone url-encoded)
        parts = [f'--b0\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n' for k, v in data.items()]
        return "multipart/form-data; boundary=b0", "".join([*parts, "--b0--\r\n"]).encode()
    sent = httpx.Request("POST", "http://front/v1/jobs", files=files, data=data or {})
    return sent.headers["content-type"], sent.read()


def _form(content_type: str, body: bytes, piece: int = 65536) -> FormData:
    """The form of ``body`` written as a server receives it, ``piece`` bytes at a time."""
    form = FormData.for_content_type(content_type)
    for start in range(0, len(body), piece):
        form.write(body[start : start + piece])
    return form


BIG = os.urandom(3 * 65536 + 17)  # over several pieces, a boundary's worth split across two


@pytest.mark.parametrize("piece", [1, 7, 65536], ids=["byte-by-byte", "7-byte-pieces", "64-KiB-pieces"])
def test_each_file_is_written_to_a_file_of_its_own_and_hashed_as_it_arrives(spool, piece):
    files = [("files", ("big.pdf", BIG[: 4096 if piece == 1 else None], "application/pdf")),
             ("files", ("small.png", b"\x89PNG small", "image/png"))]  # fmt: skip
    content_type, body = _body(files, {"pool": "local", "languages": "eng+deu"})

    post, uploaded = _form(content_type, body, piece).finish()

    assert dict(post.lists()) == {"pool": ["local"], "languages": ["eng+deu"]}
    got = uploaded.getlist("files")
    assert [(f.name, f.content_type, f.size, f.read()) for f in got] == [
        (name, kind, len(data), data) for _, (name, data, kind) in files
    ]
    assert [f.sha256 for f in got] == [hashlib.sha256(data).hexdigest() for _, (_, data, _) in files]
    assert all(os.path.dirname(f.temporary_file_path()) == str(spool) for f in got)
    for f in got:
        f.close()
    assert list(spool.iterdir()) == []


def test_the_post_it_gives_is_immutable_as_djangos_parser_leaves_it(spool):
    post, _ = _form(*_body([], {"pool": "local"})).finish()

    with pytest.raises(AttributeError, match="immutable"):
        post["pool"] = "other"


def test_fields_past_what_is_kept_in_memory_are_read_back_whole(spool):
    long = "x" * (2 * FIELDS_IN_MEMORY_BYTES)

    post, _ = _form(*_body([], {"urls": long, "pool": "local"})).finish()

    assert post["urls"] == long
    assert post["pool"] == "local"


def test_a_file_name_keeps_no_directory(spool):
    _, uploaded = _form(*_body([("files", ("../../etc/passwd.pdf", b"%PDF-", "application/pdf"))])).finish()

    assert uploaded["files"].name == "passwd.pdf"


@pytest.mark.parametrize(
    ("setting", "value", "files", "data", "error"),
    [
        ("DATA_UPLOAD_MAX_NUMBER_FILES", 2, 3, {}, TooManyFilesSent),
        ("DATA_UPLOAD_MAX_NUMBER_FIELDS", 2, 1, {"a": "1", "b": "2", "c": "3"}, TooManyFieldsSent),
        ("DATA_UPLOAD_MAX_MEMORY_SIZE", 100, 1, {"a": "x" * 101}, RequestDataTooBig),
    ],
    ids=["files", "fields", "field-bytes"],
)
def test_djangos_limits_hold_and_a_refused_body_leaves_no_file(spool, settings, setting, value, files, data, error):
    setattr(settings, setting, value)
    body = _body([("files", (f"{n}.pdf", BIG, "application/pdf")) for n in range(files)], data)

    with pytest.raises(error):
        _form(*body).finish()

    assert list(spool.iterdir()) == []


def _raw(part: bytes) -> tuple[str, bytes]:
    return "multipart/form-data; boundary=b0", b"--b0\r\n" + part + b"\r\n--b0--\r\n"


@pytest.mark.parametrize(
    ("body", "words"),
    [
        (_raw(b'Content-Disposition: form-data; name="a"; filename="f.pdf"\r\nX-Pad: '
              + b"p" * MAX_PART_HEADER_BYTES + b"\r\n\r\n%PDF-"), "header size"),
        (_raw(b'Content-Disposition: form-data; name="a"; filename="f.pdf"\r\n'
              b"Content-Transfer-Encoding: base64\r\n\r\nJVBERi0="), "Content-Transfer-Encoding"),
        (_raw(b'Content-Disposition: form-data; name="a"; filename=".."\r\n\r\n%PDF-'), "names no file"),
        (("multipart/form-data; boundary=b0", b'--b0\r\nContent-Disposition: form-data; name="a"; '
          b'filename="f.pdf"\r\n\r\n%PDF- and no closing boundary'), "closing boundary"),
        (("multipart/form-data; boundary=b0", b"--other\r\nnot a part at all"), "multipart body"),
    ],
    ids=["headers-too-long", "transfer-encoding", "dot-dot-name", "truncated", "malformed"],
)  # fmt: skip
def test_a_body_it_cannot_read_is_a_multipart_error_and_leaves_no_file(spool, body, words):
    with pytest.raises(MultiPartParserError, match=words):
        _form(*body).finish()

    assert list(spool.iterdir()) == []


def test_a_form_closed_before_it_was_read_removes_its_files(spool):
    # The connection was lost, the body refused, or the view never read the form (a 401).
    form = _form(*_body([("files", ("a.pdf", BIG, "application/pdf"))]))
    assert len(list(spool.iterdir())) == 1

    form.close()

    assert list(spool.iterdir()) == []
    with pytest.raises(MultiPartParserError, match="closed"):
        form.finish()


def test_the_files_a_form_gave_are_the_callers_once_it_closes(spool):
    # Django's request.close() closes the files it took (and so removes them) and then the body.
    form = _form(*_body([("files", ("a.pdf", BIG, "application/pdf"))]))
    _, uploaded = form.finish()

    form.close()

    assert uploaded["files"].read() == BIG


def test_a_file_moved_into_place_is_not_removed_on_close(spool, tmp_path):
    _, uploaded = _form(*_body([("files", ("a.pdf", BIG, "application/pdf"))])).finish()
    kept = tmp_path / "kept.pdf"
    os.rename(uploaded["files"].temporary_file_path(), kept)  # what a submission's staging does

    uploaded["files"].close()

    assert kept.read_bytes() == BIG


@pytest.mark.parametrize(
    "content_type",
    ["application/json", "multipart/form-data", "multipart/form-data; boundary=", "multipart/mixed; boundary=b0"],
)
def test_only_a_form_with_a_boundary_django_takes_is_read_as_it_arrives(content_type):
    assert FormData.for_content_type(content_type) is None
