"""Splitting, in workers: a document is opened, its pages counted and checked against the limits,
and their rows created a batch at a time (a page with a usable PDF text layer may keep it: ``text_mode`` skip); documents
whose fetch or split task was lost sent again. Nothing is rendered here: a page is its document
and its number, and the pod that reads it renders it (invariant 16).
"""

from __future__ import annotations

import contextlib
import logging
from typing import IO

import pypdfium2 as pdfium
from django.conf import settings
from django.db import connection, models, transaction
from django.db.models import QuerySet
from django.utils import timezone

from fleetadmin import leases
from fleetadmin.errors import DomainError
from ocrjobs.models import Dispatcher, Document, Job, Page
from ocrjobs.services.dispatchers import dispatch_ensure
from ocrjobs.services.jobs import job_refresh
from ocrjobs.services.pages import result_json
from ocrjobs.services.submission import PDFIUM_LOCK, document_pages, pdf_input
from ocrjobs.storage import document_local
from pods.enqueue import nudge_scaler
from pods.models import Pod, Pool
from podserver.textlayer import page_text_problem

log = logging.getLogger(__name__)

SPLIT_BATCH = 25


def document_split(*, document_id: int, lease: str | None = None, announce: bool = True) -> Document:
    """Count a document's pages, check them, and create their rows, a batch at a time.

    Pages become claimable batch by batch, so OCR starts before a long PDF is
    fully split. Run again after a crash, it makes only the pages still missing. A job
    cancelled meanwhile stops it at the next batch boundary.
    One task splits a document at a time: it holds the document's lease (``lease``:
    one its caller already holds), renewed batch by batch.
    Split, its job is refreshed and its pages announced (``_pages_made``) unless ``announce`` is
    False: a caller splitting many documents does that once for them all (``documents_split``).
    """
    row = Document.objects.filter(pk=document_id, status=Document.Status.PENDING)
    if lease is None:
        lease = leases.acquire(row)
        if lease is None:
            log.info("document %s: split already, or another task is splitting it", document_id)
            return Document.objects.get(pk=document_id)
    try:
        document = _split(Document.objects.select_related("job").get(pk=document_id), row, lease, announce)
    except leases.LeaseLost:
        log.warning("document %s: another task took over its split", document_id)
        return Document.objects.get(pk=document_id)
    except BaseException:
        leases.release(Document.objects.filter(pk=document_id), lease)
        raise
    if document.status != Document.Status.SPLIT:
        # Expired now: if it is still pending, the next scaler tick sends it again. (A document
        # split was released by the statement that marked it split.)
        leases.release(Document.objects.filter(pk=document_id), lease)
    return document


def _split(document: Document, row, lease: str, announce: bool = True) -> Document:
    if document.job.status == Job.Status.CANCELLED:
        return document
    existing = set(document.pages.values_list("number", flat=True))
    with contextlib.ExitStack() as stack:
        try:
            source = stack.enter_context(open(stack.enter_context(document_local(document.source)), "rb"))
        except OSError as exc:
            return _split_failed(document, f"cannot be read: {exc}")
        return _split_from(document, row, lease, source, existing, announce)


def _split_from(document: Document, row, lease: str, source: IO[bytes], existing: set[int], announce: bool) -> Document:
    try:
        page_count = document_pages(document.name, document.kind, source)
        text_layers = _TextLayers(source) if document.job.text_mode == Job.TextMode.SKIP else None
    except DomainError as exc:
        return _split_failed(document, exc.message)
    except Exception as exc:
        return _split_failed(document, f"cannot be read: {exc}")
    try:
        return _make_pages(document, row, lease, page_count, existing, text_layers, announce)
    finally:
        if text_layers is not None:
            text_layers.close()


def _split_failed(document: Document, error: str) -> Document:
    log.warning("document %s cannot be split: %s", document.pk, error)
    document.status = Document.Status.FAILED
    document.error = error[:2000]
    document.save(update_fields=["status", "error"])
    job_refresh(job_id=document.job_id)
    return document


def _make_pages(
    document, row, lease, page_count, existing, text_layers: _TextLayers | None, announce: bool
) -> Document:
    batch: list[Page] = []
    nudged = False
    for number in range(1, page_count + 1):
        if number in existing:
            continue
        batch.append(_new_page(document, number, text_layers))
        if len(batch) >= SPLIT_BATCH:
            leases.renew(row, lease)  # still ours: then these pages are ours to save
            if not _save_pages(document, batch):
                return _split_stopped(document, batch)
            batch = []
            if not nudged:
                # The first pages can be read while the rest are made.
                nudge_scaler(document.job.pool_id)
                nudged = True
    if not _save_pages(document, batch, split=(row, lease, page_count)):
        return _split_stopped(document, batch)
    document.status = Document.Status.SPLIT
    document.page_count = page_count
    if announce:
        job_refresh(job_id=document.job_id)
        _pages_made(document.job.pool_id)
    return document


def _new_page(document: Document, number: int, text_layers: _TextLayers | None) -> Page:
    page = Page(job_id=document.job_id, document=document, pool_id=document.job.pool_id, number=number)
    if text_layers is not None:
        try:
            text = text_layers.text(number)
        except Exception as exc:
            # A text layer that cannot be read: the pod reads the page instead.
            log.info("document %s page %s: no text layer (%s)", document.pk, number, exc)
            text = ""
        if text:
            _keep_text_layer(page, document, text)
    return page


def documents_split(*, document_ids: list[int]) -> list[Document]:
    """Split these documents together, in a few statements for them all: their leases taken in one,
    their pages made and the documents marked split in one transaction (``_save_split``); then the
    jobs that may have ended are refreshed and the pages announced once per pool (one by one, a
    document costs ~11 statements and a job refresh: most of the workers' CPU). A long document
    (more than SPLIT_BATCH pages) is split on its own, batch by batch, so that its first pages
    are read while the rest are made. The documents, as they are now."""
    token = leases.acquire_each(Document.objects.filter(pk__in=document_ids, status=Document.Status.PENDING))
    taken = list(Document.objects.select_related("job").filter(pk__in=document_ids, task_lease_token=token))
    existing: dict[int, set[int]] = {}
    for document_id, number in Page.objects.filter(document__in=taken).values_list("document_id", "number"):
        existing.setdefault(document_id, set()).add(number)
    made: list[tuple[Document, list[Page], int]] = []
    refresh: set[int] = set()  # jobs that may have ended: no page of theirs made here waits
    pools: set[int] = set()  # pools with new pages
    for document in taken:
        if document.job.status == Job.Status.CANCELLED:
            continue
        counted = _count_and_make(document, existing.get(document.pk, set()), token)
        if isinstance(counted, Document):  # failed, or split on its own (a long document)
            if counted.status == Document.Status.SPLIT:
                refresh.add(document.job_id)
                pools.add(document.job.pool_id)
            continue
        made.append((document, *counted))
    if made:
        split = _save_split(made, token)
        pools |= {d.job.pool_id for d, _, _ in made if d.pk in split}
        waiting = {
            d.job_id for d, pages, _ in made if d.pk in split and any(p.status == Page.Status.PENDING for p in pages)
        }
        refresh |= {d.job_id for d, _, _ in made if d.pk in split} - waiting
    unsplit = [d.pk for d in taken if d.status != Document.Status.SPLIT]
    if unsplit:  # expired now: a document still pending is sent again by the next scaler tick
        leases.release(Document.objects.filter(pk__in=unsplit), token)
    for job_id in sorted(refresh):
        job_refresh(job_id=job_id)
    for pool_id in sorted(pools):
        _pages_made(pool_id)
    others = set(document_ids) - {d.pk for d in taken}
    if others:
        log.info("documents %s: split already, or another task is splitting them", sorted(others))
        taken += Document.objects.filter(pk__in=others)
    return taken


def _count_and_make(document: Document, existing: set[int], token: str) -> tuple[list[Page], int] | Document:
    """A short document's missing pages (unsaved) and its page count; or the document, failed or
    split here on its own when it is long."""
    with contextlib.ExitStack() as stack:
        try:
            page_count, text_layers = _counted(document), None
            skip = document.job.text_mode == Job.TextMode.SKIP
            if page_count is None or (skip and document.kind == Document.Kind.PDF):
                source = stack.enter_context(open(stack.enter_context(document_local(document.source)), "rb"))
                page_count = page_count or document_pages(document.name, document.kind, source)
                if skip:
                    text_layers = stack.enter_context(contextlib.closing(_TextLayers(source)))
        except DomainError as exc:
            return _split_failed(document, exc.message)
        except Exception as exc:
            return _split_failed(document, f"cannot be read: {exc}")
        if page_count > SPLIT_BATCH:
            row = Document.objects.filter(pk=document.pk, status=Document.Status.PENDING)
            try:
                return _make_pages(document, row, token, page_count, existing, text_layers, announce=False)
            except leases.LeaseLost:
                log.warning("document %s: another task took over its split", document.pk)
                return document
        return [
            _new_page(document, number, text_layers) for number in range(1, page_count + 1) if number not in existing
        ], page_count


def _counted(document: Document) -> int | None:
    """The page count taken as the document arrived (front or fetch: ``document_pages`` on these
    bytes, every limit checked), which the split trusts rather than measure every page again (a third
    of its CPU); None: open and count (as for a count over a page limit lowered since)."""
    arrived = document.page_count > 0 and document.sha256  # not a URL still to fetch, nor made otherwise
    return document.page_count if arrived and document.page_count <= settings.OCR_MAX_PAGES_PER_DOCUMENT else None


def _save_split(made: list[tuple[Document, list[Page], int]], token: str) -> set[int]:
    """Save the pages of these documents and mark them split, in one transaction; the ids of the
    documents split. A document of a job cancelled meanwhile is not (it stays pending, as in
    ``_save_pages``). Should one of them no longer hold this task's lease, each is saved on its own
    instead, and only those still this task's are split."""
    try:
        with transaction.atomic():
            jobs = {d.job_id for d, _, _ in made}
            statuses = dict(Job.objects.select_for_update().filter(pk__in=jobs).values_list("pk", "status"))
            live = [(d, pages, count) for d, pages, count in made if statuses[d.job_id] != Job.Status.CANCELLED]
            by_count: dict[int, list[int]] = {}
            for document, _, count in live:
                by_count.setdefault(count, []).append(document.pk)
            now = timezone.now()
            marked = sum(
                Document.objects.filter(pk__in=ids, status=Document.Status.PENDING, task_lease_token=token).update(
                    status=Document.Status.SPLIT, page_count=count, task_lease_until=now, split_at=now
                )
                for count, ids in by_count.items()
            )
            if marked != len(live):
                raise leases.LeaseLost("another task took over some of these rows")
            _insert_pages([page for _, pages, _ in live for page in pages])
            started = [job_id for job_id, status in statuses.items() if status == Job.Status.QUEUED]
            if started:
                Job.objects.filter(pk__in=started, status=Job.Status.QUEUED).update(status=Job.Status.RUNNING)
    except leases.LeaseLost:
        return _save_split_each(made, token)
    for document, _, count in live:
        document.status, document.page_count = Document.Status.SPLIT, count
    return {d.pk for d, _, _ in live}


def _insert_pages(pages: list[Page]) -> None:
    """``Page.objects.bulk_create(pages, ignore_conflicts=True)`` in one prepared statement run for
    every row: Django's compiler took more than the rest of the split's saving (0.17 ms a page)."""
    if not pages:
        return
    fields = [field for field in Page._meta.concrete_fields if not field.primary_key]
    adapt = connection.ops.adapt_datetimefield_value
    dated = {field.attname for field in fields if isinstance(field, models.DateTimeField)}
    rows = [
        [adapt(getattr(page, f.attname)) if f.attname in dated else getattr(page, f.attname) for f in fields]
        for page in pages
    ]
    quote = connection.ops.quote_name
    sql = (
        f"INSERT INTO {quote(Page._meta.db_table)} ({', '.join(quote(f.column) for f in fields)}) "
        f"VALUES ({', '.join(['%s'] * len(fields))}) ON CONFLICT (document_id, number) DO NOTHING"
    )
    with connection.cursor() as cursor:
        cursor.executemany(sql, rows)


def _save_split_each(made: list[tuple[Document, list[Page], int]], token: str) -> set[int]:
    split = set()
    for document, pages, count in made:
        row = Document.objects.filter(pk=document.pk, status=Document.Status.PENDING)
        try:
            if _save_pages(document, pages, split=(row, token, count)):
                document.status, document.page_count = Document.Status.SPLIT, count
                split.add(document.pk)
        except leases.LeaseLost:
            log.warning("document %s: another task took over its split", document.pk)
    return split


def _pages_made(pool_id: int) -> None:
    """New pages wait. A live dispatcher of the pool claims them (and nudges the scaler itself when
    they wait for lanes; one that is leaving looks again after it ended). Else, with a ready pod
    (a warm one, or one still in its idle time), a dispatcher starts now: the tick's queue hop
    (~0.2-0.4 s before a first page) is skipped, and it nudges the scaler when pages wait for
    lanes. Else the scaler hears now. A tick per document split would be most of the workers' CPU."""
    if Dispatcher.objects.live().filter(pool_id=pool_id).exists():
        return
    pool = Pool.objects.filter(pk=pool_id, pods__state=Pod.State.READY).first()
    if pool is not None:
        dispatch_ensure(pool=pool)
    else:
        nudge_scaler(pool_id)


def _save_pages(document: Document, pages: list[Page], *, split: tuple[QuerySet, str, int] | None = None) -> bool:
    """Save a batch of pages, or nothing (False) once the job is cancelled. The job's status is
    read under its row lock in the transaction that saves the batch, as ``job_cancel`` takes it:
    a cancel either comes first and the batch is never saved, or comes after and cancels it.

    The last batch (``split``: the document's pending row, the lease, its page count) also marks
    the document split and ends the lease, in the same transaction and one statement, which
    matches only while the lease is still this task's (else LeaseLost, and nothing is saved):
    three statements before (renew, save, release), of ~11 per document split."""
    with transaction.atomic():
        job = Job.objects.select_for_update().filter(pk=document.job_id).values_list("status", flat=True)
        status = job.get()
        if status == Job.Status.CANCELLED:
            return False
        if pages:
            Page.objects.bulk_create(pages, ignore_conflicts=True)
            if status == Job.Status.QUEUED:  # read under the lock: no statement when it runs already
                Job.objects.filter(pk=document.job_id, status=Job.Status.QUEUED).update(status=Job.Status.RUNNING)
        if split is not None:
            row, lease, page_count = split
            marked = row.filter(task_lease_token=lease).update(
                status=Document.Status.SPLIT,
                page_count=page_count,
                task_lease_until=timezone.now(),
                split_at=timezone.now(),
            )
            if not marked:
                raise leases.LeaseLost("another task took over this row")
    return True


def _split_stopped(document: Document, unsaved: list[Page]) -> Document:
    """The job was cancelled mid-split: the split stops at this batch boundary. The pages not made
    yet never are (a cancelled job costs no more rows or pods; its pages so far were
    cancelled with it); the batch made meanwhile is dropped unsaved. The document stays pending,
    as one whose split never started after a cancel does."""
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


class _TextLayers:
    """A PDF's embedded text, page by page; an image has none."""

    def __init__(self, source: IO[bytes]):
        self.pdf = None
        head = source.read(5)
        source.seek(0)
        if head == b"%PDF-":
            with PDFIUM_LOCK:
                self.pdf = pdfium.PdfDocument(pdf_input(source))

    def text(self, number: int) -> str:
        """The page's embedded text, when it has enough to count as a text page and is text
        (not mojibake: such a page is read, and the pod's answer warns of its layer)."""
        if self.pdf is None:
            return ""
        with PDFIUM_LOCK, contextlib.closing(self.pdf[number - 1]) as page:
            with contextlib.closing(page.get_textpage()) as textpage:
                text = textpage.get_text_bounded().replace("\r\n", "\n").strip()
                if len(text.replace(" ", "").replace("\n", "")) < TEXT_LAYER_MIN_CHARS:
                    return ""
                return "" if page_text_problem(textpage) else text

    def close(self) -> None:
        if self.pdf is not None:
            with PDFIUM_LOCK:
                self.pdf.close()
