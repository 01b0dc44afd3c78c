"""ocrjobs.services.submission: what a submission keeps of its files, checks before storing any, and
hashes as the bytes arrive; PDFium called one thread at a time."""

from __future__ import annotations

import hashlib
import io
import re

import pytest
from django.db import connection

from fleetadmin.errors import Invalid
from ocrjobs.models import Job
from ocrjobs.services.submission import Upload, job_submit
from tests.factories import PAGES_TRUTH, image_bytes, pdf_bytes
from tests.ocrjobs.helpers import files_under, submit

pytestmark = pytest.mark.usefixtures("local_pool")


@pytest.mark.parametrize(
    ("sent", "stored"),
    [
        ("../../etc/passwd.pdf", "passwd.pdf"),
        ("..\\..\\x.pdf", "x.pdf"),
        ("..", "document"),
        ("/abs/path/.hidden.pdf", "hidden.pdf"),
        ("bell\x07and\nnewline.pdf", "bellandnewline.pdf"),
    ],
)
def test_submit_keeps_only_a_clean_file_name_and_stores_the_file_under_a_name_of_its_own(
    ordinary_user, media_root, tmp_path, sent, stored
):
    job = submit(ordinary_user, {sent: pdf_bytes(PAGES_TRUTH[:1])})

    document = job.documents.get()
    assert document.name == stored
    assert re.fullmatch(r"documents/[0-9a-f]{32}/source\.pdf", document.source), document.source
    assert files_under(tmp_path) == [media_root / document.source]


def test_submit_checks_every_file_before_storing_any(ordinary_user, media_root):
    with pytest.raises(Invalid) as refused:
        submit(ordinary_user, {"good.pdf": pdf_bytes(PAGES_TRUTH[:1]), "bad.pdf": b"%PDF-1.4 nonsense"})

    assert "bad.pdf" in refused.value.message
    assert Job.objects.count() == 0
    assert files_under(media_root) == []


def test_submit_without_a_pool_uses_the_first_pool(ordinary_user, local_pool):
    job = job_submit(owner=ordinary_user, uploads=[Upload(name="a.png", file=io.BytesIO(image_bytes(["a"])))])

    assert job.pool == local_pool
    assert job.languages == "eng"


def test_submission_hashes_the_document_as_its_bytes_arrive(ordinary_user):
    content = pdf_bytes(PAGES_TRUTH[:1])
    job = submit(ordinary_user, {"report.pdf": content})

    document = job.documents.get()
    assert document.sha256 == hashlib.sha256(content).hexdigest()
    assert document.source_path.read_bytes() == content


def test_pdfs_submitted_from_several_threads_at_once_use_pdfium_one_call_at_a_time(
    transactional_db, local_pool, ordinary_user, media_root, monkeypatch
):
    """The front checks each request's uploads on a thread of its own, and PDFium is not
    thread-safe (pypdfium2's documentation): concurrent submissions each get their PDFs' pages
    right, and no two PDFium calls overlap (submission.PDFIUM_LOCK)."""
    import threading
    import time

    import pypdfium2 as pdfium

    inside, most = [0], [0]
    count = threading.Lock()
    real_formtype = pdfium.PdfDocument.get_formtype  # (the XFA check: a call on every PDF submitted)

    def get_formtype(self):
        with count:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
        time.sleep(0.002)  # (widens the window another thread's call would overlap in)
        try:
            return real_formtype(self)
        finally:
            with count:
                inside[0] -= 1

    monkeypatch.setattr(pdfium.PdfDocument, "get_formtype", get_formtype)
    documents = [pdf_bytes(PAGES_TRUTH[: 1 + n % 3]) + f"\n% {n}\n".encode() for n in range(12)]
    start, errors, jobs = threading.Barrier(6), [], []

    def submitting(offset: int) -> None:
        try:
            start.wait(30)
            files = {f"d{offset + n}.pdf": documents[offset + n] for n in (0, 6)}
            jobs.append(submit(ordinary_user, files))
        except BaseException as exc:  # (reported below, with the others)
            errors.append(exc)
        finally:
            connection.close()  # this thread's own

    threads = [threading.Thread(target=submitting, args=(offset,)) for offset in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)

    assert errors == []
    assert most[0] == 1
    counts = sorted(d.page_count for job in jobs for d in job.documents.all())
    assert counts == sorted(1 + n % 3 for n in range(12))
