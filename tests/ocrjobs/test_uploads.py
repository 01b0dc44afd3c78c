"""Multipart bodies go through Django's own parser (request.FILES); the project's upload handler
(ocrjobs/uploads.py) hashes each file it spools as the bytes arrive."""

from __future__ import annotations

import hashlib
import io
import os

import httpx
from django.core.files.uploadedfile import InMemoryUploadedFile, TemporaryUploadedFile
from django.core.handlers.asgi import ASGIRequest

BIG = os.urandom(6 * 1024 * 1024)  # over FILE_UPLOAD_MAX_MEMORY_SIZE: spooled to a temporary file


def _request(files: list, data: dict | None = None) -> ASGIRequest:
    sent = httpx.Request("POST", "http://front/v1/jobs", files=files, data=data or {})
    body = sent.read()
    headers = [(b"content-type", sent.headers["content-type"].encode()), (b"content-length", str(len(body)).encode())]
    scope = {"type": "http", "method": "POST", "path": "/v1/jobs", "query_string": b"", "headers": headers}
    return ASGIRequest(scope, io.BytesIO(body))


def test_a_body_over_the_memory_size_is_spooled_and_each_file_hashed_as_it_arrives(tmp_path, settings):
    spool = tmp_path / "spool"
    spool.mkdir()
    settings.FILE_UPLOAD_TEMP_DIR = str(spool)
    files = [("files", ("big.pdf", BIG, "application/pdf")), ("files", ("small.png", b"\x89PNG small", "image/png"))]
    request = _request(files, {"pool": "local"})

    uploaded = request.FILES.getlist("files")

    assert request.POST["pool"] == "local"
    assert all(isinstance(f, TemporaryUploadedFile) for f in uploaded)
    assert all(f.temporary_file_path().startswith(str(spool)) for f in uploaded)
    assert [(f.name, f.content_type, f.read()) for f in uploaded] == [
        ("big.pdf", "application/pdf", BIG),
        ("small.png", "image/png", b"\x89PNG small"),
    ]
    assert [f.sha256 for f in uploaded] == [
        hashlib.sha256(BIG).hexdigest(),
        hashlib.sha256(b"\x89PNG small").hexdigest(),
    ]


def test_a_small_body_stays_in_memory():
    request = _request([("files", ("small.png", b"\x89PNG small", "image/png"))])

    (small,) = request.FILES.getlist("files")

    assert isinstance(small, InMemoryUploadedFile)  # hashed as it is staged (submission._stage)
    assert small.read() == b"\x89PNG small"
