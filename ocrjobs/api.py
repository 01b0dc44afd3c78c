"""JSON endpoints for jobs: submit, status, results, cancel, retry."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Iterator
from decimal import Decimal

from asgiref.sync import sync_to_async
from django.conf import settings
from django.core.exceptions import RequestDataTooBig, TooManyFilesSent
from django.core.handlers.asgi import ASGIRequest
from django.http import HttpRequest, JsonResponse, StreamingHttpResponse
from django.http.multipartparser import MultiPartParserError

from fleetadmin.api import ApiError, Cursor, api_view, parse_json
from ocrjobs import selectors
from ocrjobs.models import Job
from ocrjobs.schemas import (
    JobSubmission,
    LineCorrectionBody,
    SubmissionFields,
    job_submit_arguments,
    submission_from_form,
)
from ocrjobs.serializers import correction_dict, job_dict, secret_dict, webhook_delivery_dict
from ocrjobs.services import jobs as job_services
from ocrjobs.services import outputs
from ocrjobs.services.corrections import line_correct
from ocrjobs.services.idempotency import job_submit_once
from ocrjobs.services.submission import Upload, job_submit
from ocrjobs.services.webhooks import webhook_secret_rotate, webhook_secret_row
from pods.audit import Actor
from pods.models import AuditEntry
from pods.services.forecast import job_forecast_again
from pods.spend import jobs_spend


def _job_for(request: HttpRequest, job_id: int) -> Job:
    job = selectors.jobs_visible_to(request.api_user, request.api_scopes).filter(pk=job_id).first()
    if job is None:
        raise ApiError(f"no job {job_id}", 404)
    return job


def _job_dict(job: Job, *, dollars: Decimal | None = None) -> dict:
    """The job as the API shows it; ``dollars``: its cost so far, when the caller has it already."""
    if dollars is None:
        dollars = jobs_spend([job.pk])[job.pk]
    documents = list(job.documents.select_related("searchable_pdf"))
    body = job_dict(job, documents=documents)
    for shown, document in zip(body["documents"], documents, strict=True):
        shown["outputs"] = outputs.document_outputs_dict(job, document)
    return {
        **body,
        # The forecast made at submission on a guess (a fresh pool), made again on what the pool has
        # measured since (null when the one made at submission was measured already).
        "forecast_again": job_forecast_again(job),
        "webhook_deliveries": [webhook_delivery_dict(delivery) for delivery in job.webhook_deliveries.all()],
        **_job_links(job, dollars),
    }


def _submitted_job_dict(job: Job) -> dict:
    """A job this request just made, answered without reading back what the request knows: its
    documents, and no pages, spend or webhook deliveries yet (its split starts once it is
    committed). Five queries fewer on every submission."""
    counts = dict.fromkeys(Job.PAGE_COUNTS, 0)
    body = job_dict(job, documents=job.submitted_documents, page_counts=counts)
    for shown, document in zip(body["documents"], job.submitted_documents, strict=True):
        shown["outputs"] = outputs.document_outputs_dict(job, document, submitted=True)
    return {
        **body,
        "forecast_again": None,  # its forecast was made now: nothing measured since
        "webhook_deliveries": [],
        **_job_links(job, Decimal(0)),
    }


def _job_links(job: Job, dollars: Decimal) -> dict:
    return {
        "dollars": float(dollars),
        "urls": {
            "self": f"/v1/jobs/{job.pk}",
            "result_txt": f"/v1/jobs/{job.pk}/result.txt",
            "result_jsonl": f"/v1/jobs/{job.pk}/result.jsonl",
            "result_md": f"/v1/jobs/{job.pk}/result.md",
            "outputs_zip": f"/v1/jobs/{job.pk}/outputs.zip",
            "pages": f"/v1/jobs/{job.pk}/pages",
            "page": job.get_absolute_url(),
        },
    }


@api_view(scope="read", methods=("GET", "POST"))
def jobs(request: HttpRequest) -> JsonResponse:
    if request.method == "GET":
        # Newest first, a page at a time; the `next` link goes on to older jobs.
        cursor = Cursor.from_request(request)
        visible = selectors.jobs_visible_to(request.api_user, request.api_scopes)
        recent, next_after = cursor.page(visible, descending=True)
        spend = jobs_spend(job.pk for job in recent)
        return JsonResponse(
            {
                "jobs": [_job_dict(job, dollars=spend[job.pk]) for job in recent],
                "next": cursor.next_url(request.path, next_after),
            }
        )
    # Listing is a read; submitting needs more.
    if "submit" not in request.api_scopes:
        raise ApiError("this needs the 'submit' scope", 403)
    _refuse_query_fields(request)
    length = int(request.META.get("CONTENT_LENGTH") or 0)
    if length > settings.OCR_MAX_REQUEST_BYTES:
        raise ApiError(f"the request is larger than the limit of {settings.OCR_MAX_REQUEST_BYTES} bytes", 413)
    if request.content_type.startswith("application/json"):
        # Documents by URL only: {"urls": [...], "pool": ..., "languages": ..., "text_mode": ...}
        fields = _json_submission(request)
        uploads = []
    elif request.content_type.startswith("multipart/form-data"):
        try:
            files = request.FILES.getlist("files") + request.FILES.getlist("file")
        except TooManyFilesSent:
            limit = settings.DATA_UPLOAD_MAX_NUMBER_FILES
            raise ApiError(f"too many files; the limit is {limit} per request", 413) from None
        except RequestDataTooBig:
            raise ApiError("the form fields are larger than the limit", 413) from None
        except MultiPartParserError as exc:
            # Django would answer its own HTML 400; the API answers JSON.
            raise ApiError(f"the multipart body cannot be read: {exc}", 400) from None
        uploads = [Upload(name=f.name, file=f) for f in files]
        fields = _multipart_fields(request)
    else:
        raise ApiError("send the files as multipart/form-data (field 'files'), or URLs as JSON (field 'urls')", 415)
    submission = job_submit_arguments(fields)
    if fields.dry_run:
        # Checked as a submission is, answered with the forecast; nothing is stored (no key either).
        forecast = job_submit(owner=request.api_user, uploads=uploads, dry_run=True, **submission)
        return JsonResponse({"dry_run": True, "forecast": forecast})
    key = request.headers.get("Idempotency-Key")
    if key is None:
        job = job_submit(owner=request.api_user, uploads=uploads, **submission)
        return JsonResponse(_submitted_job_dict(job), status=201)
    job, created = job_submit_once(
        owner=request.api_user, key=key, fields=fields.model_dump(), uploads=uploads, **submission
    )
    response = JsonResponse(_submitted_job_dict(job) if created else _job_dict(job), status=201 if created else 200)
    if not created:
        response["Idempotent-Replayed"] = "true"
    return response


def _refuse_query_fields(request: HttpRequest) -> None:
    """A submission's fields travel in its body. A field in the query string is refused, not
    ignored: ignored, ``?languages=eng;rm -rf`` would run as ``eng`` without a word."""
    if request.GET:
        name = next(iter(request.GET))
        raise ApiError(f"POST /v1/jobs takes its fields in the body, not the query string (got {name[:40]!r})", 400)


def _multipart_fields(request: HttpRequest) -> SubmissionFields:
    """The form fields of a multipart submission, strictly: an unknown field, or a field that
    takes one value sent twice, is refused rather than dropped."""
    names = ", ".join(SubmissionFields.model_fields)
    for name in request.POST:
        if name not in SubmissionFields.model_fields:
            raise ApiError(f"unknown field {name[:40]!r} (fields: files, {names})", 400)
    for name in request.FILES:
        if name not in ("files", "file"):
            raise ApiError(f"unknown file field {name[:40]!r}: send documents as 'files'", 400)
    return submission_from_form(request.POST)


JSON_SUBMISSION_MAX_BYTES = 1_000_000


def _json_submission(request: HttpRequest) -> JobSubmission:
    # Judged by the declared length before the body is read: reading a body past Django's
    # DATA_UPLOAD_MAX_MEMORY_SIZE raises RequestDataTooBig (its HTML 400 page, unless caught).
    try:
        declared = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        raise ApiError("the Content-Length header is not a number", 400) from None
    if declared > JSON_SUBMISSION_MAX_BYTES or len(request.body) > JSON_SUBMISSION_MAX_BYTES:
        raise ApiError("the JSON body is larger than 1 MB", 413)
    return parse_json(request, JobSubmission, max_bytes=JSON_SUBMISSION_MAX_BYTES)


@api_view(scope="read")
def job_detail(request: HttpRequest, job_id: int) -> JsonResponse:
    return JsonResponse(_job_dict(_job_for(request, job_id)))


@api_view(scope="read")
def job_pages(request: HttpRequest, job_id: int) -> JsonResponse:
    """The job's pages with their results, a page of them at a time, in the order they were made
    (page order within each document): only the pages answered are read. result.jsonl streams
    them all."""
    cursor = Cursor.from_request(request)
    job = _job_for(request, job_id)
    pages, next_after = cursor.page(job.pages.select_related("document"))
    return JsonResponse(
        {
            "job": job.pk,
            "pages": [{"id": page.pk, **page.to_record()} for page in pages],
            "next": cursor.next_url(request.path, next_after),
        }
    )


@api_view(scope="webhooks")
def webhook_secret(request: HttpRequest) -> JsonResponse:
    """The caller's key for checking the signature of its jobs' events (made on first ask). Its
    own scope: a read token (a monitoring scraper's) cannot learn it and forge events."""
    return JsonResponse(secret_dict(webhook_secret_row(request.api_user)))


@api_view(scope="webhooks", methods=("POST",))
def webhook_secret_rotate_view(request: HttpRequest) -> JsonResponse:
    """A new secret; the one before still signs events (a second signature) for a grace period."""
    return JsonResponse(secret_dict(webhook_secret_rotate(request.api_user)))


RESULT_LINES_PER_CHUNK = 200


async def _in_chunks(lines: Iterator[str]) -> AsyncIterator[str]:
    """``lines`` taken RESULT_LINES_PER_CHUNK at a time in the request's thread. Under ASGI,
    Django reads a synchronous iterator whole into memory before it sends a byte (a job's result
    can be gigabytes); an asynchronous one is sent as it comes."""
    take = sync_to_async(lambda: "".join(itertools.islice(lines, RESULT_LINES_PER_CHUNK)))
    while chunk := await take():
        yield chunk


def _download(request: HttpRequest, job: Job, lines: Iterator[str], *, content_type: str, suffix: str):
    if isinstance(request, ASGIRequest):  # (WSGI and the test client iterate the lines as they are)
        lines = _in_chunks(lines)
    response = StreamingHttpResponse(lines, content_type=f"{content_type}; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="job-{job.pk}.{suffix}"'
    return response


@api_view(scope="read")
def job_result_txt(request: HttpRequest, job_id: int) -> StreamingHttpResponse:
    job = _job_for(request, job_id)
    return _download(request, job, selectors.job_result_txt(job), content_type="text/plain", suffix="txt")


@api_view(scope="read")
def job_result_jsonl(request: HttpRequest, job_id: int) -> StreamingHttpResponse:
    job = _job_for(request, job_id)
    lines = selectors.job_result_jsonl(job)
    return _download(request, job, lines, content_type="application/jsonl", suffix="jsonl")


@api_view(scope="submit", methods=("POST",))
def job_cancel(request: HttpRequest, job_id: int) -> JsonResponse:
    job = job_services.job_cancel(job=_job_for(request, job_id), actor=Actor(request.api_user, AuditEntry.Door.API))
    return JsonResponse(_job_dict(job))


@api_view(scope="submit", methods=("POST",))
def job_outputs_rebuild(request: HttpRequest, job_id: int) -> JsonResponse:
    """Build the job's searchable PDFs again (202): its owner's only, once the job has ended."""
    job = _job_for(request, job_id)
    if job.owner_id != request.api_user.pk:
        raise ApiError(f"only the owner of job {job.pk} may rebuild its outputs", 403)
    documents = outputs.job_outputs_rebuild(job=job, user=request.api_user, door=AuditEntry.Door.API)
    return JsonResponse({**_job_dict(job), "rebuilding_documents": documents}, status=202)


@api_view(scope="submit", methods=("POST",))
def job_retry(request: HttpRequest, job_id: int) -> JsonResponse:
    job = _job_for(request, job_id)
    if job.status not in (Job.Status.PARTIAL, Job.Status.FAILED):
        raise ApiError(f"job {job.pk} is {job.status}: only a partial or failed job has pages to retry", 409)
    pages, documents = job_services.job_retry(job=job, actor=Actor(request.api_user, AuditEntry.Door.API))
    job.refresh_from_db()
    return JsonResponse({**_job_dict(job), "retried_pages": pages, "retried_documents": documents})


@api_view(scope="submit", methods=("PATCH",))
def job_line_correct(request: HttpRequest, job_id: int, page_id: int, line: int) -> JsonResponse:
    """Correct a line of a page read (the job's owner or staff): the outputs read the correction,
    the engine's reading kept beside it; a searchable PDF built before is built again."""
    body = parse_json(request, LineCorrectionBody)
    job = Job.objects.filter(pk=job_id).first()  # (another user's job: 403, as for a rebuild)
    if job is None:
        raise ApiError(f"no job {job_id}", 404)
    correction = line_correct(job=job, page_id=page_id, line=line, text=body.text, user=request.api_user)
    return JsonResponse(correction_dict(correction))
