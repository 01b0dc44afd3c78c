"""The split of submitted documents trusts the page count that the front took as they arrived
(with every limit checked on the same bytes), and opens a document only when it must."""

from __future__ import annotations

import io

import pytest

from ocrjobs.models import Document, Page
from ocrjobs.services import split as split_services
from ocrjobs.services.submission import Upload, job_submit
from tests.factories import PAGES_TRUTH, image_bytes, pdf_bytes
from tests.ocrjobs.helpers import blank_tiff_frames, submit

pytestmark = pytest.mark.usefixtures("local_pool")


@pytest.fixture
def counted(monkeypatch) -> list[str]:
    """The documents the split opens and counts itself (their names)."""
    opened: list[str] = []
    document_pages = split_services.document_pages

    def counting(name, kind, file):
        opened.append(name)
        return document_pages(name, kind, file)

    monkeypatch.setattr(split_services, "document_pages", counting)
    return opened


def split_all(job) -> list[Document]:
    return split_services.documents_split(document_ids=list(job.documents.values_list("pk", flat=True)))


def test_split_together_documents_are_not_opened_again_for_the_count_the_front_took(ordinary_user, counted):
    job = submit(ordinary_user, {"a.pdf": pdf_bytes(PAGES_TRUTH[:3]), "b.png": image_bytes(["b"])})

    documents = split_all(job)

    assert counted == []
    assert [(d.status, d.page_count) for d in documents] == [(Document.Status.SPLIT, 3), (Document.Status.SPLIT, 1)]
    assert sorted(job.pages.values_list("number", flat=True)) == [1, 1, 2, 3]


def test_a_split_trusts_no_count_its_document_did_not_arrive_with(ordinary_user, counted):
    job = submit(ordinary_user, {"a.pdf": pdf_bytes(PAGES_TRUTH[:2])})
    job.documents.update(page_count=0)  # as a document not counted as it arrived

    (document,) = split_all(job)

    assert counted == ["a.pdf"]
    assert document.status == Document.Status.SPLIT and job.pages.count() == 2


def test_a_trusted_count_over_a_page_limit_lowered_since_fails_the_document(ordinary_user, settings, counted):
    job = submit(ordinary_user, {"a.pdf": pdf_bytes(PAGES_TRUTH[:3])})
    settings.OCR_MAX_PAGES_PER_DOCUMENT = 2

    (document,) = split_all(job)

    assert document.status == Document.Status.FAILED and "limit is 2 pages" in document.error
    assert job.pages.count() == 0


def test_text_layers_are_still_read_from_the_pdf_when_the_job_keeps_them(ordinary_user, counted, monkeypatch):
    upload = Upload(name="a.pdf", file=io.BytesIO(pdf_bytes(PAGES_TRUTH[:2])))
    job = job_submit(owner=ordinary_user, uploads=[upload], pool_key="local", skip_text_pages=True)
    opened = []
    text_layers = split_services._TextLayers

    class Watched(text_layers):
        def __init__(self, source):
            opened.append(source.name)
            super().__init__(source)

    monkeypatch.setattr(split_services, "_TextLayers", Watched)

    split_all(job)

    assert len(opened) == 1 and counted == []  # opened for its text layers, its count trusted
    assert job.pages.filter(status=Page.Status.PENDING).count() == 2  # scanned pages: no text layer


def test_a_split_that_counts_a_tiff_refuses_it_for_its_pixels_in_all(ordinary_user, settings):
    """Review N2 at split time: a document whose count the split takes itself (a URL fetched, a
    count not trusted) is refused for its pixels summed over its frames, with the figures."""
    settings.OCR_MAX_DOCUMENT_PIXELS = 10**15  # let it in, as a document stored before the limit
    job = submit(ordinary_user, {"blank.tif": blank_tiff_frames(3000)})
    settings.OCR_MAX_DOCUMENT_PIXELS = 30_000_000_000
    job.documents.update(page_count=0)

    (document,) = split_all(job)

    assert document.status == Document.Status.FAILED
    assert "3000 frames are 300,000,000,000 pixels in all" in document.error
    assert "30,000,000,000 pixels a document" in document.error
    assert job.pages.count() == 0
