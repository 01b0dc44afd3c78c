"""Every multipart body is read by fleetadmin.formdata.FormData through the project's upload handler
(ocrjobs/uploads.py): one the front read as it arrived is taken as it is, any other is read from
the request's stream; either way each file is in a temporary file of its own, hashed."""

from __future__ import annotations

import contextvars
import hashlib
import io
import os

import httpx
from django.core.handlers.asgi import ASGIRequest

from fleetadmin import formdata
from fleetadmin.formdata import FormData, ReceivedFile

BIG = os.urandom(3 * 1024 * 1024)


def _sent(files: list, data: dict | None = None) -> tuple[bytes, list]:
    sent = httpx.Request("POST", "http://front/v1/jobs", files=files, data=data or {})
    body = sent.read()
    headers = [(b"content-type", sent.headers["content-type"].encode()), (b"content-length", str(len(body)).encode())]
    return body, headers


def _scope(headers: list) -> dict:
    return {"type": "http", "method": "POST", "path": "/v1/jobs", "query_string": b"", "headers": headers}


def test_a_body_from_the_requests_stream_is_read_into_hashed_files_of_their_own(spool):
    files = [("files", ("big.pdf", BIG, "application/pdf")), ("files", ("small.png", b"\x89PNG small", "image/png"))]
    body, headers = _sent(files, {"pool": "local"})
    request = ASGIRequest(_scope(headers), io.BytesIO(body))

    uploaded = request.FILES.getlist("files")

    assert request.POST["pool"] == "local"
    assert all(isinstance(f, ReceivedFile) and f.temporary_file_path().startswith(str(spool)) for f in uploaded)
    assert [(f.name, f.content_type, f.read()) for f in uploaded] == [
        ("big.pdf", "application/pdf", BIG),
        ("small.png", "image/png", b"\x89PNG small"),
    ]
    assert [f.sha256 for f in uploaded] == [
        hashlib.sha256(BIG).hexdigest(),
        hashlib.sha256(b"\x89PNG small").hexdigest(),
    ]
    request.close()
    assert list(spool.iterdir()) == []  # (each file removed with the request)


def test_a_body_the_front_read_as_it_arrived_is_taken_as_it_is(spool):
    body, headers = _sent([("files", ("big.pdf", BIG, "application/pdf"))], {"pool": "local"})
    form = FormData.for_content_type(dict(headers)[b"content-type"].decode())
    form.write(body)
    request = ASGIRequest(_scope(headers), form)  # the body file Django gets: it reads empty

    def files():
        formdata.received.set(form)  # (fleetadmin.asgi's handler sets it for the request)
        return request.FILES.getlist("files")

    (uploaded,) = contextvars.copy_context().run(files)

    assert request.POST["pool"] == "local"
    assert (uploaded.read(), uploaded.sha256) == (BIG, hashlib.sha256(BIG).hexdigest())
    request.close()
    assert form.closed
    assert list(spool.iterdir()) == []
