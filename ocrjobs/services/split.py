"""Splitting, in workers: a document's pages rendered to images (or kept as their PDF text
layer) and their rows created a batch at a time; documents whose fetch or split task was lost
sent again.
"""

from __future__ import annotations

import io
import logging
import posixpath
from pathlib import Path

import pypdfium2 as pdfium
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from fleetadmin import leases
from ocrjobs.models import Document, Job, Page
from ocrjobs.services.jobs import _nudge, job_refresh
from ocrjobs.services.pages import result_json
from ocrjobs.services.submission import open_image
from ocrjobs.storage import document_delete, document_local, document_save_bytes

log = logging.getLogger(__name__)

SPLIT_BATCH = 25


def document_split(*, document_id: int, lease: str | None = None) -> Document:
    """Render a document's pages to images and create their rows, a batch at a time.

    Pages become claimable batch by batch, so OCR starts before a long PDF is
    fully split. Run again after a crash, it makes only the pages still missing. A job
    cancelled meanwhile stops it at the next batch boundary.
    One task splits a document at a time: it holds the document's lease (``lease``:
    one its caller already holds), renewed batch by batch.
    """
    row = Document.objects.filter(pk=document_id, status=Document.Status.PENDING)
    if lease is None:
        lease = leases.acquire(row)
        if lease is None:
            log.info("document %s: split already, or another task is splitting it", document_id)
            return Document.objects.get(pk=document_id)
    try:
        return _split(Document.objects.select_related("job").get(pk=document_id), row, lease)
    except leases.LeaseLost:
        log.warning("document %s: another task took over its split", document_id)
        return Document.objects.get(pk=document_id)
    finally:
        # Expired now: if it is still pending, the next scaler tick sends it again.
        leases.release(Document.objects.filter(pk=document_id), lease)


def _split(document: Document, row, lease: str) -> Document:
    if document.job.status == Job.Status.CANCELLED:
        return document
    pages_dir = f"{posixpath.dirname(document.source)}/pages"
    existing = set(document.pages.values_list("number", flat=True))
    with document_local(document.source) as source:
        return _split_from(document, row, lease, source, pages_dir, existing)


def _split_from(document: Document, row, lease: str, source: Path, pages_dir: str, existing: set[int]) -> Document:
    try:
        renderer = _PageRenderer(document, source)
    except Exception as exc:
        log.warning("document %s cannot be split: %s", document.pk, exc)
        document.status = Document.Status.FAILED
        document.error = f"cannot be read: {exc}"[:2000]
        document.save(update_fields=["status", "error"])
        job_refresh(job_id=document.job_id)
        return document
    try:
        batch: list[Page] = []
        nudged = False
        for number in range(1, document.page_count + 1):
            if number in existing:
                continue
            page = Page(job_id=document.job_id, document=document, pool_id=document.job.pool_id, number=number)
            text = renderer.text_layer(number) if document.job.skip_text_pages else ""
            try:
                if text:
                    _keep_text_layer(page, document, text)
                else:
                    page.image = renderer.render(number, pages_dir)
            except Exception as exc:
                # One bad page must not cost the rest of the document.
                page.status = Page.Status.FAILED
                page.error = f"page could not be rendered: {exc}"[:2000]
                page.finished_at = timezone.now()
            batch.append(page)
            if len(batch) >= SPLIT_BATCH:
                leases.renew(row, lease)  # still ours: then these pages are ours to save
                if not _save_pages(document, batch):
                    return _split_stopped(document, batch)
                batch = []
                if not nudged:
                    # The first pages can be read while the rest are rendered.
                    _nudge(document.job.pool_id)
                    nudged = True
        leases.renew(row, lease)
        if not _save_pages(document, batch):
            return _split_stopped(document, batch)
    finally:
        renderer.close()
    document.status = Document.Status.SPLIT
    document.save(update_fields=["status"])
    job_refresh(job_id=document.job_id)
    _nudge(document.job.pool_id)
    return document


def documents_recover(*, pool_id: int) -> list[int]:
    """Send again the fetch or split of every waiting document whose task never started
    or stopped renewing its lease (its worker was killed; the broker lost it)."""
    lost = leases.expired(
        Document.objects.filter(job__pool_id=pool_id, status=Document.Status.PENDING).exclude(
            job__status=Job.Status.CANCELLED
        )
    )
    documents = list(lost.values_list("pk", "kind"))
    if not documents:
        return []
    Document.objects.filter(pk__in=[pk for pk, _ in documents]).update(**leases.queued())
    fetches = [pk for pk, kind in documents if kind == Document.Kind.URL]
    splits = [pk for pk, kind in documents if kind != Document.Kind.URL]
    log.warning("pool %s: sending again %d fetches and %d splits whose tasks were lost", pool_id, len(fetches),
                len(splits))  # fmt: skip
    from ocrjobs.tasks import enqueue_fetch, enqueue_split  # ocrjobs.tasks imports the services

    for document_id in fetches:
        enqueue_fetch(document_id)
    for document_id in splits:
        enqueue_split(document_id)
    return [pk for pk, _ in documents]


def _save_pages(document: Document, pages: list[Page]) -> bool:
    """Save a batch of pages, or nothing (False) once the job is cancelled. The job's status is
    read under its row lock in the transaction that saves the batch, as ``job_cancel`` takes it:
    a cancel either comes first and the batch is never saved, or comes after and cancels it."""
    with transaction.atomic():
        job = Job.objects.select_for_update().filter(pk=document.job_id).values_list("status", flat=True)
        if job.get() == Job.Status.CANCELLED:
            return False
        if pages:
            Page.objects.bulk_create(pages, ignore_conflicts=True)
            Job.objects.filter(pk=document.job_id, status=Job.Status.QUEUED).update(status=Job.Status.RUNNING)
    return True


def _split_stopped(document: Document, unsaved: list[Page]) -> Document:
    """The job was cancelled mid-split: the split stops at this batch boundary. The pages not made
    yet never are (a cancelled job costs no more renders, rows or pods; its pages so far were
    cancelled with it), and the files of the batch rendered meanwhile go. The document stays
    pending, as one whose split never started after a cancel does."""
    for page in unsaved:
        if page.image and page.image != document.source:
            document_delete(page.image)
    log.info("document %s: its job was cancelled, the split stops", document.pk)
    return document


TEXT_LAYER_MIN_CHARS = 20


def _keep_text_layer(page: Page, document: Document, text: str) -> None:
    """A page whose PDF already has text keeps it: done without a pod, confidence 100."""
    result = {"text": text, "lines": [], "confidence": 100.0, "width": None, "height": None, "source": "text layer"}
    page.result = result_json(result)
    page.status = Page.Status.DONE
    page.confidence = 100.0
    page.seconds = 0.0
    page.finished_at = timezone.now()


class _PageRenderer:
    def __init__(self, document: Document, source: Path):
        self.document = document
        self.pdf = None
        self.image = None
        if document.kind == Document.Kind.PDF:
            self.pdf = pdfium.PdfDocument(str(source))
        else:
            self.image = open_image(source)
            self.frames = getattr(self.image, "n_frames", 1)

    def render(self, number: int, pages_dir: str) -> str:
        """The page's image, stored beside its document (the name it was stored under)."""
        png = io.BytesIO()
        if self.pdf is not None:
            page = self.pdf[number - 1]
            try:
                bitmap = page.render(scale=settings.OCR_RENDER_DPI / 72, grayscale=True)
                bitmap.to_pil().save(png, format="PNG", compress_level=1)
            finally:
                page.close()
            return document_save_bytes(f"{pages_dir}/{number}.png", png.getvalue())
        if self.frames == 1 and self.image.format in ("PNG", "JPEG"):
            # Taken as it is: the pod reads PNG and JPEG directly.
            self.image.load()
            return self.document.source
        self.image.seek(number - 1)
        frame = self.image.convert("L") if self.image.mode not in ("L", "RGB") else self.image
        frame.save(png, format="PNG", compress_level=1)
        return document_save_bytes(f"{pages_dir}/{number}.png", png.getvalue())

    def text_layer(self, number: int) -> str:
        """The page's embedded text, when it has enough to count as a text page."""
        if self.pdf is None:
            return ""
        page = self.pdf[number - 1]
        try:
            textpage = page.get_textpage()
            try:
                text = textpage.get_text_bounded().replace("\r\n", "\n").strip()
            finally:
                textpage.close()
        finally:
            page.close()
        return text if len(text.replace(" ", "").replace("\n", "")) >= TEXT_LAYER_MIN_CHARS else ""

    def close(self) -> None:
        if self.pdf is not None:
            self.pdf.close()
        if self.image is not None:
            self.image.close()
