"""A job's outputs beyond result.txt and result.jsonl (issue 25): Markdown, each document's own
text, Markdown and records, the searchable PDFs asked for when the job ends, and the job's
outputs as one zip. Readers yield text a page (or a line) at a time and read rows a chunk at a
time, whatever the job's size: the downloads stream them (ocrjobs/downloads.py).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import PurePosixPath

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import connection, transaction
from django.utils import timezone

from fleetadmin import leases
from fleetadmin.errors import Conflict, QuotaExceeded
from ocrjobs import storage
from ocrjobs.enqueue import enqueue_searchable_pdfs
from ocrjobs.models import Document, Job, OutputRebuild, Page, SearchablePdf
from ocrjobs.results import StoredResult
from pods.audit import Actor, audit_record
from pods.models import AuditEntry

ROWS_PER_QUERY = 500

# --- asking for the searchable PDFs --------------------------------------------------------------


# Jobs whose outputs are built: a cancelled job's pages that were read are worth as much as a
# finished job's (the others keep their original page, without text).
WITH_OUTPUTS = (Job.Status.DONE, Job.Status.PARTIAL, Job.Status.CANCELLED)


def job_outputs_request(*, jobs: list[Job]) -> None:
    """When jobs end (in the transaction that ends them): the split documents of those done,
    partial or cancelled that asked for searchable PDFs (``Job.searchable_pdf``) get a pending one,
    built by the outputs workers once this is committed; in the others, only documents whose PDF
    was asked for since (a download) are built again, so that a job that ends again after a retry
    has them with its new pages. Two statements at most whatever the number of jobs (the
    dispatcher ends jobs in batches: tests/ocrjobs/test_jobs_refresh.py counts them)."""
    ended = [job for job in jobs if job.status in WITH_OUTPUTS]
    _request_builds([job.pk for job in ended if job.searchable_pdf])
    _request_builds([job.pk for job in ended if not job.searchable_pdf], only_asked=True)


def job_outputs_rebuild(*, job: Job, user, door: str = AuditEntry.Door.PAGE) -> int:
    """Build the job's searchable PDFs again (the job page's button, ``POST
    /v1/jobs/{id}/outputs/rebuild``), asked by ``user``, its owner: the number of documents asked
    for. A build still running is overtaken: it stores nothing (searchable_pdf_build). Conflict
    for a job that has not ended or has no page read; QuotaExceeded past the user's
    OUTPUT_REBUILDS_PER_HOUR (each rebuild may hold the outputs workers for a build's time limit).
    A document's builds whose workers died are still counted (``attempts``): a rebuild gives a
    document that kills its worker one more try, not PDF_BUILD_ATTEMPTS more. ``door``: where
    ``user`` asked (the audit record, pods/audit.py)."""
    with transaction.atomic():
        get_user_model().objects.select_for_update().filter(pk=user.pk).first()  # a user's rebuilds in turn
        job = Job.objects.select_for_update().get(pk=job.pk)
        if job.status not in WITH_OUTPUTS:
            raise Conflict(
                f"job {job.pk} is {job.status}: outputs are built once it is done, partial or cancelled",
            )
        if not job.pages.filter(status=Page.Status.DONE).exists():
            raise Conflict(f"job {job.pk} has no page read: there is no text to build its searchable PDFs from")
        hour_ago = timezone.now() - timezone.timedelta(hours=1)
        if OutputRebuild.objects.filter(owner=user, at__gte=hour_ago).count() >= settings.OUTPUT_REBUILDS_PER_HOUR:
            raise QuotaExceeded(f"you asked for {settings.OUTPUT_REBUILDS_PER_HOUR} rebuilds in the last hour "
                           "(OUTPUT_REBUILDS_PER_HOUR): ask again later")  # fmt: skip
        documents = _request_builds([job.pk])
        OutputRebuild.objects.create(owner=user, job=job, documents=documents)
        audit_record(actor=Actor(user=user, door=door), action=AuditEntry.Action.REBUILD, job=job,
                     detail=f"searchable PDFs of {documents} documents")  # fmt: skip
        return documents


def document_pdf_request(*, document: Document) -> bool:
    """A searchable PDF that its job did not ask for, asked for by its first download: built by
    the outputs workers like the others. Whether one is now pending (False: the document has no
    pages to lay text on, or its job has not ended)."""
    with transaction.atomic():
        job = Job.objects.select_for_update().get(pk=document.job_id)
        if job.status not in WITH_OUTPUTS or document.status != Document.Status.SPLIT:
            return False
        return _request_builds([job.pk], document_id=document.pk) > 0


def document_pdf_outdated(*, document: Document) -> bool:
    """The document's text changed after its searchable PDF was asked for (a corrected line): a
    new build is asked for, run by the outputs workers (never on the page path, invariant 20). A
    build not started yet reads the new text as it is, so only a PDF built, failed or being built
    is asked for again. Whether one was."""
    stale = SearchablePdf.objects.filter(document=document).exclude(status=SearchablePdf.Status.PENDING)
    if not stale.exists():
        return False
    return _request_builds([document.job_id], only_asked=True, document_id=document.pk) > 0


def _request_builds(job_ids: list[int], *, only_asked: bool = False, document_id: int | None = None) -> int:
    """Each split document of the jobs (or the one ``document_id``; with ``only_asked``, only
    those that have a searchable PDF row already): a pending searchable PDF of a new generation,
    its task's lease queued (a lost task is sent again: services/recover.py); enqueued once
    committed. The number of documents."""
    if not job_ids:
        return 0
    rows, documents = SearchablePdf._meta.db_table, Document._meta.db_table
    pending, split = SearchablePdf.Status.PENDING, Document.Status.SPLIT
    adapt, lease = connection.ops.adapt_datetimefield_value, leases.queued()["task_lease_until"]
    which, extra = "", []
    if document_id is not None:
        which, extra = " AND id = %s", [document_id]
    if only_asked:
        which += f" AND EXISTS (SELECT 1 FROM {rows} WHERE {rows}.document_id = {documents}.id)"
    with connection.cursor() as cursor:
        # (SQLite reads ON CONFLICT after a SELECT only when the SELECT has a WHERE: it has.)
        cursor.execute(
            f"INSERT INTO {rows} (document_id, status, name, size_bytes, error, builds, attempts, generation, "
            f"pages_missing, updated_at, task_lease_until, task_lease_token) "
            f"SELECT id, %s, '', 0, '', 0, 0, 1, 0, %s, %s, '' FROM {documents} "
            f"WHERE job_id IN ({', '.join(['%s'] * len(job_ids))}) AND status = %s{which} "
            f"ON CONFLICT (document_id) DO UPDATE SET status = %s, error = '', generation = {rows}.generation + 1, "
            f"task_lease_until = %s, task_lease_token = ''",
            [pending, adapt(timezone.now()), adapt(lease), *job_ids, split, *extra, pending, adapt(lease)],
        )
        count = cursor.rowcount
    if count:
        transaction.on_commit(lambda: enqueue_searchable_pdfs(job_ids=job_ids))
    return count


def searchable_pdfs_pending(*, job_id: int) -> list[int]:
    """The job's documents whose searchable PDF waits to be built."""
    pending = SearchablePdf.objects.filter(document__job_id=job_id, status=SearchablePdf.Status.PENDING)
    return list(pending.order_by("document__position").values_list("document_id", flat=True))


# --- Markdown ------------------------------------------------------------------------------------

_MARKDOWN_SPECIAL = re.compile(r"([\\`*_\[\]<>#|~])")
_BLOCK_START = re.compile(r"^(\s*)(\d*)([-+=.)])")  # a list item, a rule or an underline


def page_markdown(result: StoredResult) -> str:
    """A page as Markdown: an engine's that writes Markdown (its answer says so: vlm) as it wrote
    it; any other's text as paragraphs (its blank lines part them, the lines of one are joined),
    escaped so that it reads as the text it is."""
    text = result.text
    if result.markdown:
        return text.strip("\n")
    paragraphs = []
    for block in re.split(r"\n\s*\n", text):
        joined = " ".join(line.strip() for line in block.splitlines() if line.strip())
        if joined:
            paragraphs.append(_BLOCK_START.sub(r"\1\2\\\3", _MARKDOWN_SPECIAL.sub(r"\\\1", joined)))
    return "\n\n".join(paragraphs)


def _comment(text: str) -> str:
    return "<!-- " + text.replace("--", "- -").replace("\n", " ") + " -->"


def document_markdown(document: Document) -> Iterator[str]:
    """The document's pages as Markdown, each after a comment that names it (invisible once
    rendered); pages that have no text say why in theirs."""
    if document.status == Document.Status.FAILED:
        yield _comment(f"document failed: {document.error}") + "\n"
        return
    first = True
    for page in _document_pages(document):
        yield ("" if first else "\n") + _comment(f"page {page.number}") + "\n\n"
        first = False
        if page.status == Page.Status.DONE:
            markdown = page_markdown(StoredResult.from_row(page) or StoredResult())
            yield markdown + "\n" if markdown else ""
        else:
            yield _comment(f"page {page.number}: {page.status}{': ' + page.error if page.error else ''}") + "\n"


def job_result_md(job: Job) -> Iterator[str]:
    """Every document's Markdown under a heading with its name."""
    for index, document in enumerate(job.documents.order_by("position").iterator(chunk_size=ROWS_PER_QUERY)):
        yield ("\n" if index else "") + "# " + _MARKDOWN_SPECIAL.sub(r"\\\1", document.name) + "\n\n"
        yield from document_markdown(document)


# --- one document's text and records -------------------------------------------------------------


def _document_pages(document: Document):
    return document.pages.order_by("number").iterator(chunk_size=ROWS_PER_QUERY)


def document_result_txt(document: Document) -> Iterator[str]:
    """The document's text, a form feed between pages (as pdftotext and the ocr command write it)."""
    for index, page in enumerate(_document_pages(document)):
        result = StoredResult.from_row(page)
        text = result.text if result else ""
        yield ("\f" if index else "") + text


def document_result_jsonl(document: Document) -> Iterator[str]:
    """result.jsonl's records of the document's pages."""
    if document.status == Document.Status.FAILED:
        record = {"document": document.name, "document_id": document.pk, "page": None, "status": "failed",
                  "text": "", "lines": [], "confidence": None, "error": document.error}  # fmt: skip
        yield json.dumps(record, ensure_ascii=False) + "\n"
        return
    for page in document.pages.select_related("document").order_by("number").iterator(chunk_size=ROWS_PER_QUERY):
        yield json.dumps(page.to_record(), ensure_ascii=False) + "\n"


PDF_STATES = {SearchablePdf.Status.PENDING: "pending", SearchablePdf.Status.BUILDING: "building",
              SearchablePdf.Status.BUILT: "ready", SearchablePdf.Status.FAILED: "failed"}  # fmt: skip


def document_outputs_dict(job: Job, document: Document, *, submitted: bool = False) -> dict:
    """A document's outputs as the API shows them: the text downloads' URLs (they stream what is
    read so far), and the searchable PDF's state: ``pending`` (until its job ends, or asked for
    again), ``building``, ``ready`` (with its URL; ``pages_missing``: pages kept without text),
    ``failed`` (with the error), ``on_request`` (its job did not ask for one: its URL's first
    download by the job's owner asks for it, ``searchable_pdf``), ``none`` (its job ended without
    one: no page read, not split).
    ``document.searchable_pdf`` is best selected with it (select_related); ``submitted``: the
    document was made by this request, so it has no PDF yet (nothing is read)."""
    base = f"/v1/jobs/{job.pk}/documents/{document.pk}"
    pdf = None if submitted else document.searchable_pdf_or_none
    if pdf is None:
        if job.searchable_pdf and not job.is_finished:
            state = {"state": "pending"}
        elif (job.status in WITH_OUTPUTS and document.status == Document.Status.SPLIT) or not job.is_finished:
            state = {"state": "on_request", "url": f"{base}/result.pdf"}
        else:
            state = {"state": "none"}
    else:
        state = {"state": PDF_STATES[pdf.status], "builds": pdf.builds}
        if pdf.status == SearchablePdf.Status.BUILT:
            state.update(url=f"{base}/result.pdf", size_bytes=pdf.size_bytes, pages_missing=pdf.pages_missing,
                         partial=pdf.pages_missing > 0)  # fmt: skip
        elif pdf.status == SearchablePdf.Status.FAILED:
            state["error"] = pdf.error
    return {"pdf": state, "txt": f"{base}/result.txt", "md": f"{base}/result.md", "jsonl": f"{base}/result.jsonl",
            "hocr": f"{base}/result.hocr", "alto": f"{base}/result.alto.xml"}  # fmt: skip


def document_searchable_pdf(document: Document) -> SearchablePdf | None:
    return SearchablePdf.objects.filter(document=document).first()


def searchable_pdf_chunks(pdf: SearchablePdf) -> Iterator[bytes]:
    """The stored PDF's bytes, a chunk at a time."""
    with storage.documents().open(pdf.name, "rb") as f:
        while chunk := f.read(storage.CHUNK):
            yield chunk


# --- names in the zip and on disk ----------------------------------------------------------------


def output_stems(documents: list[Document]) -> dict[int, str]:
    """{document id: a file name stem}: the document's name without its extension, made unique in
    the job (``-2``, ``-3`` …), never a path (a name like ``../x`` stays one file)."""
    stems, used = {}, set()
    for document in documents:
        stem = PurePosixPath(document.name.replace("\\", "/")).stem.strip(". ") or f"document-{document.position}"
        candidate, n = stem, 2
        while candidate.lower() in used:
            candidate, n = f"{stem}-{n}", n + 1
        used.add(candidate.lower())
        stems[document.pk] = candidate
    return stems
