"""The job page's page viewer: its batches of pages, and each document's bytes for the browser to
draw (pdf.js) or show (an image), streamed from the storage API to whoever may see the job."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Iterator

from asgiref.sync import sync_to_async
from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.core.handlers.asgi import ASGIRequest
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET, require_POST

from fleetadmin.api import status_for
from fleetadmin.errors import DomainError
from ocrjobs import selectors, storage
from ocrjobs.models import Job
from ocrjobs.serializers import correction_dict
from ocrjobs.services.corrections import line_correct, may_correct
from ocrjobs.viewer import (
    VIEWER_BATCH,
    document_source,
    image_type,
    viewer_batch,
    viewer_counts,
    viewer_lines_to_check,
)

# At most 19 digits a number (review N8: Python refuses to read over 4,300 as an int, a 500).
RANGE = re.compile(r"^bytes=(\d{0,19})-(\d{0,19})$")


def _job_for(request: HttpRequest, job_id: int) -> Job:
    job = selectors.jobs_visible_to(request.user).filter(pk=job_id).first()
    if job is None:
        raise Http404("no such job")
    return job


def _offset(request: HttpRequest) -> int:
    try:
        return max(0, int(request.GET.get("offset", "0")))
    except ValueError:
        return 0


def viewer_context(request: HttpRequest, job: Job, *, offset: int = 0) -> dict:
    """What the viewer's templates need: the threshold, the counts on the first render, a batch."""
    threshold = settings.VIEWER_CONFIDENCE_THRESHOLD
    only_to_check = request.GET.get("check") == "1"
    items, next_offset = viewer_batch(
        job, threshold=threshold, only_to_check=only_to_check, offset=offset, limit=VIEWER_BATCH
    )
    return {
        "job": job,
        "threshold": threshold,
        "fair_from": (threshold + 100) / 2,
        "only_to_check": only_to_check,
        "viewer_items": items,
        "next_offset": next_offset,
        "batch": VIEWER_BATCH,
    }


def viewer_first_render(request: HttpRequest, job: Job) -> dict:
    context = viewer_context(request, job)
    context["viewer_counts"] = viewer_counts(job, threshold=context["threshold"])
    context["may_correct"] = may_correct(request.user, job)
    return context


@login_required
@require_GET
def job_viewer_batch(request: HttpRequest, job_id: int) -> HttpResponse:
    """The next batch of pages, asked for by htmx as the last one comes into view."""
    job = _job_for(request, job_id)
    return render(request, "ocrjobs/viewer_batch.html", viewer_context(request, job, offset=_offset(request)))


@login_required
@require_GET
def job_viewer_lines(request: HttpRequest, job_id: int) -> HttpResponse:
    """How many lines of the job are to check, asked for by the viewer's bar once it is shown."""
    job = _job_for(request, job_id)
    threshold = settings.VIEWER_CONFIDENCE_THRESHOLD
    lines = viewer_lines_to_check(job, threshold=threshold)
    return render(request, "ocrjobs/viewer_lines.html", {"lines": lines, "threshold": threshold})


async def _sent_as_read(chunks: Iterator[bytes]) -> AsyncIterator[bytes]:
    """Each chunk read in a worker thread and sent before the next is read. Under ASGI, Django
    reads a synchronous iterator whole into memory before it sends a byte (ocrjobs/api.py)."""
    read = sync_to_async(lambda: next(chunks, None), thread_sensitive=False)
    try:
        while (chunk := await read()) is not None:
            yield chunk
    finally:
        await sync_to_async(chunks.close, thread_sensitive=False)()


@login_required
@require_GET
def job_document(request: HttpRequest, job_id: int, document_id: int) -> HttpResponse:
    """A document's bytes as stored, streamed a chunk at a time (one range of them when asked:
    pdf.js reads a long PDF's pages without fetching all of it). Only PDFs and the images a
    browser shows are served, and they are sandboxed: a document is never a page of this site."""
    job = _job_for(request, job_id)
    document = job.documents.filter(pk=document_id).first()
    if document is None or not document_source(document):
        raise Http404("no such document")
    content_type = "application/pdf" if document_source(document) == "pdf" else image_type(document)
    try:
        size = storage.document_size(document.source)
    except storage.StorageError as exc:
        return HttpResponse(str(exc), status=502, content_type="text/plain; charset=utf-8")
    start, end, status = 0, size, 200
    match = RANGE.match(request.headers.get("Range", ""))
    if match and any(match.groups()):
        first, last = match.groups()
        if first:
            start, end = int(first), min(size, int(last) + 1) if last else size
        elif last:
            start = max(0, size - int(last))
        if start >= end:
            response = HttpResponse(status=416)
            response["Content-Range"] = f"bytes */{size}"
            return response
        status = 206
    chunks = storage.document_chunks(document.source, start, end)
    if isinstance(request, ASGIRequest):  # (WSGI and the test client iterate the chunks as they are)
        chunks = _sent_as_read(chunks)
    response = StreamingHttpResponse(chunks, status=status, content_type=content_type)
    response["Content-Length"] = str(end - start)
    response["Accept-Ranges"] = "bytes"
    if status == 206:
        response["Content-Range"] = f"bytes {start}-{end - 1}/{size}"
    response["Content-Security-Policy"] = "sandbox; default-src 'none'"
    response["X-Content-Type-Options"] = "nosniff"
    response["Cache-Control"] = "private, max-age=3600"
    return response


@login_required
@require_POST
def job_line_correct(request: HttpRequest, job_id: int, page_id: int, line: int) -> JsonResponse:
    """The viewer's correction of a line (a form's ``text``, with the CSRF token): the stored line
    as JSON, or ``{"error": ...}`` with its status, shown under the line's field."""
    job = Job.objects.filter(pk=job_id).first()
    if job is None:
        return JsonResponse({"error": "no such job"}, status=404)
    try:
        correction = line_correct(job=job, page_id=page_id, line=line, text=request.POST.get("text"), user=request.user)
    except DomainError as exc:
        return JsonResponse({"error": exc.message}, status=status_for(exc))
    return JsonResponse(correction_dict(correction))
