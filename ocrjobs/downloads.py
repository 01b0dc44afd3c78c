"""Downloads of a job's outputs (issue 25): the job's Markdown, each document's text, Markdown,
records and searchable PDF, and everything as one zip. Each is streamed: rows are read a chunk
at a time and the zip is written as it is sent (zipstream-ng), never made whole in memory.

Authorised as the other result endpoints: a token with ``read`` or the browser's session, and
only the caller's own jobs unless staff or ``admin`` (the job page links here).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Iterator

from asgiref.sync import sync_to_async
from django.core.handlers.asgi import ASGIRequest
from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from zipstream import ZIP_DEFLATED, ZIP_STORED, ZipStream

from fleetadmin.api import ApiError, api_view
from ocrjobs import selectors
from ocrjobs.models import Document, Job, SearchablePdf
from ocrjobs.services import layout_xml, outputs

# Under ASGI a chunk is taken in the request's thread and sent before the next is made: about
# this many bytes a step (one thread hop each), whatever the job's size.
CHUNK_BYTES = 256 * 1024


def _job_for(request: HttpRequest, job_id: int) -> Job:
    job = selectors.jobs_visible_to(request.api_user, request.api_scopes).filter(pk=job_id).first()
    if job is None:
        raise ApiError(f"no job {job_id}", 404)
    return job


def _document_for(request: HttpRequest, job_id: int, document_id: int) -> Document:
    job = _job_for(request, job_id)
    document = job.documents.select_related("job").filter(pk=document_id).first()
    if document is None:
        raise ApiError(f"job {job.pk} has no document {document_id}", 404)
    return document


def _as_bytes(parts: Iterable[str | bytes]) -> Iterator[bytes]:
    """Parts joined into chunks of about CHUNK_BYTES."""
    buffer, size = [], 0
    for part in parts:
        data = part.encode() if isinstance(part, str) else part
        buffer.append(data)
        size += len(data)
        if size >= CHUNK_BYTES:
            yield b"".join(buffer)
            buffer, size = [], 0
    if buffer:
        yield b"".join(buffer)


async def _async(chunks: Iterator[bytes]) -> AsyncIterator[bytes]:
    """Under ASGI, Django reads a synchronous iterator whole into memory before it sends a byte;
    an asynchronous one is sent as it comes. Each chunk is made in the request's thread (the
    database reads are synchronous)."""
    take = sync_to_async(lambda: next(chunks, b""))
    while chunk := await take():
        yield chunk


def _stream(request, parts: Iterable[str | bytes], *, content_type: str, filename: str):
    chunks = _as_bytes(parts)
    body = _async(chunks) if isinstance(request, ASGIRequest) else chunks
    response = StreamingHttpResponse(body, content_type=content_type)
    response["Content-Disposition"] = f'attachment; filename="{_ascii(filename)}"'
    return response


def _ascii(name: str) -> str:
    return "".join(c if c.isascii() and c.isprintable() and c not in '"\\' else "_" for c in name) or "download"


@api_view(scope="read")
def job_result_md(request: HttpRequest, job_id: int) -> StreamingHttpResponse:
    job = _job_for(request, job_id)
    return _stream(request, outputs.job_result_md(job), content_type="text/markdown; charset=utf-8",
                   filename=f"job-{job.pk}.md")  # fmt: skip


def _document_stem(document: Document) -> str:
    documents = list(document.job.documents.only("pk", "name", "position").order_by("position"))
    return outputs.output_stems(documents)[document.pk]


def _document_download(reader, *, content_type: str, suffix: str):
    """The view of one document's text download: ``reader(document)`` yields its parts."""

    @api_view(scope="read")
    def view(request: HttpRequest, job_id: int, document_id: int) -> StreamingHttpResponse:
        document = _document_for(request, job_id, document_id)
        return _stream(request, reader(document), content_type=f"{content_type}; charset=utf-8",
                       filename=f"{_document_stem(document)}.{suffix}")  # fmt: skip

    view.__name__ = view.__qualname__ = f"document_result_{suffix.split('.')[0]}"
    return view


document_result_txt = _document_download(outputs.document_result_txt, content_type="text/plain", suffix="txt")
document_result_md = _document_download(outputs.document_markdown, content_type="text/markdown", suffix="md")
document_result_jsonl = _document_download(outputs.document_result_jsonl, content_type="application/jsonl",
                                           suffix="jsonl")  # fmt: skip
document_result_hocr = _document_download(layout_xml.document_hocr, content_type="text/html", suffix="hocr")
document_result_alto = _document_download(layout_xml.document_alto, content_type="application/xml",
                                          suffix="alto.xml")  # fmt: skip


# Seconds a client is told to wait before it asks again for a searchable PDF being built.
PDF_RETRY_AFTER_SECONDS = 5


@api_view(scope="read")
def document_result_pdf(request: HttpRequest, job_id: int, document_id: int) -> HttpResponse:
    """The searchable PDF. 202 while it is being built, and on the first download of one its job
    did not ask for (``searchable_pdf``), which asks for it: by its owner only, once the job has
    ended. 409 when its build failed (with why), or when it cannot be built."""
    document = _document_for(request, job_id, document_id)
    pdf = outputs.document_searchable_pdf(document)
    if pdf is None:
        job = document.job
        if not job.is_finished:
            raise ApiError(f"the searchable PDF of document {document.pk} is built once job {job.pk} has ended", 409)
        if job.owner_id is None or job.owner_id != request.api_user.pk:
            raise ApiError(f"job {job.pk} did not ask for searchable PDFs: only its owner's download asks for one", 409)
        if not outputs.document_pdf_request(document=document):
            raise ApiError(f"document {document.pk} has no searchable PDF: none of its pages was read", 409)
        return _being_built(document)
    if pdf.status in (SearchablePdf.Status.PENDING, SearchablePdf.Status.BUILDING):
        return _being_built(document)
    if pdf.status == SearchablePdf.Status.FAILED:
        raise ApiError(f"the searchable PDF of document {document.pk} could not be built: {pdf.error}", 409)
    response = _stream(request, outputs.searchable_pdf_chunks(pdf), content_type="application/pdf",
                       filename=f"{_document_stem(document)}.ocr.pdf")  # fmt: skip
    response["X-Pages-Missing"] = str(pdf.pages_missing)  # (pages kept without text: failed, cancelled)
    return response


def _being_built(document: Document) -> JsonResponse:
    message = f"the searchable PDF of document {document.pk} is being built: ask again in a few seconds"
    response = JsonResponse({"state": "building", "message": message}, status=202)
    response["Retry-After"] = str(PDF_RETRY_AFTER_SECONDS)
    return response


def job_zip(job: Job) -> ZipStream:
    """The job's outputs as a zip that is written as it is read: result.txt, result.md and
    result.jsonl, then each document's .txt, .md, .jsonl, .hocr, .alto.xml and, once built, .pdf
    under documents/.
    Every member is a generator: nothing is read before the zip reaches it."""
    archive = ZipStream(compress_type=ZIP_DEFLATED, sized=False)
    archive.add(_as_bytes(selectors.job_result_txt(job)), "result.txt")
    archive.add(_as_bytes(outputs.job_result_md(job)), "result.md")
    archive.add(_as_bytes(selectors.job_result_jsonl(job)), "result.jsonl")
    documents = list(job.documents.select_related("searchable_pdf").order_by("position"))
    stems = outputs.output_stems(documents)
    for document in documents:
        stem = f"documents/{stems[document.pk]}"
        archive.add(_as_bytes(outputs.document_result_txt(document)), f"{stem}.txt")
        archive.add(_as_bytes(outputs.document_markdown(document)), f"{stem}.md")
        archive.add(_as_bytes(outputs.document_result_jsonl(document)), f"{stem}.jsonl")
        archive.add(_as_bytes(layout_xml.document_hocr(document)), f"{stem}.hocr")
        archive.add(_as_bytes(layout_xml.document_alto(document)), f"{stem}.alto.xml")
        pdf = getattr(document, "searchable_pdf", None)
        if pdf is not None and pdf.status == SearchablePdf.Status.BUILT:
            archive.add(outputs.searchable_pdf_chunks(pdf), f"{stem}.ocr.pdf", compress_type=ZIP_STORED)
    return archive


@api_view(scope="read")
def job_outputs_zip(request: HttpRequest, job_id: int) -> StreamingHttpResponse:
    job = _job_for(request, job_id)
    return _stream(request, job_zip(job), content_type="application/zip", filename=f"job-{job.pk}.zip")
