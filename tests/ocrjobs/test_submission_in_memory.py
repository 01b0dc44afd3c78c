"""Submissions whose files are views of a request body held in memory (ocrjobs.uploads.BodyFile, the
API's usual case behind daphne): each document is checked where its bytes lie and written once, to
its name in the documents' storage; no temporary file, no staging directory; a refused or failed
submission leaves no file and no row."""

from __future__ import annotations

import hashlib
import io

import httpx
import pytest
from django.core.handlers.asgi import ASGIRequest

from fleetadmin.api import ApiError
from ocrjobs.services.submission import Upload, job_submit
from ocrjobs.uploads import BodyFile, HashingTemporaryFileUploadHandler, parse_in_memory
from tests.factories import PAGES_TRUTH, corrupt_pdf_bytes, image_bytes, pdf_bytes
from tests.ocrjobs.helpers import assert_nothing_made, files_under

pytestmark = pytest.mark.usefixtures("local_pool")


def _uploads(files: dict[str, bytes]) -> list[Upload]:
    """The files as POST /v1/jobs has them from a body daphne kept in memory."""
    sent = httpx.Request(
        "POST", "http://front/v1/jobs", files=[("files", (n, d, "application/pdf")) for n, d in files.items()]
    )
    body = sent.read()
    headers = [(b"content-type", sent.headers["content-type"].encode()), (b"content-length", str(len(body)).encode())]
    request = ASGIRequest({"type": "http", "method": "POST", "path": "/v1/jobs", "headers": headers}, io.BytesIO(body))
    assert parse_in_memory(request)
    uploaded = request.FILES.getlist("files")
    assert all(isinstance(f, BodyFile) for f in uploaded)
    return [Upload(name=f.name, file=f) for f in uploaded]


@pytest.fixture
def no_spooling(monkeypatch):
    def spooled(*args, **kwargs):
        raise AssertionError("an upload held in memory was spooled to a temporary file")

    monkeypatch.setattr(HashingTemporaryFileUploadHandler, "new_file", spooled)


def test_each_document_is_written_once_to_its_name_with_no_temporary_file(ordinary_user, media_root, no_spooling):
    files = {"a.pdf": pdf_bytes(PAGES_TRUTH[:2]), "b.png": image_bytes(["one line"])}

    job = job_submit(owner=ordinary_user, uploads=_uploads(files), pool_key="local")

    documents = list(job.documents.order_by("position"))
    assert [(d.name, d.kind, d.page_count) for d in documents] == [("a.pdf", "pdf", 2), ("b.png", "image", 1)]
    assert [d.sha256 for d in documents] == [hashlib.sha256(data).hexdigest() for data in files.values()]
    assert [d.source_path.read_bytes() for d in documents] == list(files.values())
    assert files_under(media_root) == sorted(d.source_path for d in documents)
    assert not (media_root / "staging").exists()  # nothing staged: no directory made and removed


def test_a_bad_file_among_good_ones_in_memory_makes_nothing(ordinary_user, media_root):
    files = {"good.pdf": pdf_bytes(PAGES_TRUTH[:1]), "bad.pdf": corrupt_pdf_bytes(), "good.png": image_bytes(["x"])}

    with pytest.raises(ApiError, match="bad.pdf"):
        job_submit(owner=ordinary_user, uploads=_uploads(files), pool_key="local")

    assert_nothing_made(media_root)
