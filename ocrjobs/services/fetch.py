"""URL documents, fetched by a worker (never the front): every address the name resolves to
is checked, the download is pinned to the checked address, redirects are checked the same
way, the size cap and the total deadline hold (ocrjobs/services/remote.py); then the file is
staged like an upload and split.
"""

from __future__ import annotations

import io
import logging
import shutil
import time
import urllib.parse
import uuid
from datetime import timedelta
from pathlib import Path

from django.conf import settings
from django.db.models import F, QuerySet
from django.utils import timezone

from fleetadmin import leases
from fleetadmin.errors import DomainError, RemoteFailed, TooLarge
from ocrjobs.models import Document, Job
from ocrjobs.services import remote
from ocrjobs.services.fetch_turns import fetches_start
from ocrjobs.services.jobs import job_refresh
from ocrjobs.services.split import document_split
from ocrjobs.services.submission import Staged, Upload, name_from_url, stage_upload
from ocrjobs.storage import document_delete, document_store

log = logging.getLogger(__name__)


class _Response(io.RawIOBase):
    """A streamed HTTP body as a file (its deadline and size cap are the exchange's)."""

    def __init__(self, chunks):
        self.chunks = chunks
        self.buffer = b""

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        while size < 0 or len(self.buffer) < size:
            chunk = next(self.chunks, b"")
            if not chunk:
                break
            self.buffer += chunk
        data, self.buffer = (self.buffer, b"") if size < 0 else (self.buffer[:size], self.buffer[size:])
        return data


def document_fetch(*, document_id: int) -> Document:
    """Fetch a URL document (in a worker): every address the name resolves to must be public,
    redirects are checked the same way, the size cap and the total deadline hold; then it is
    checked like an upload and split. A bad URL fails its document, not the job.

    The fetch holds the document's short lease and renews it as the bytes come in, so the scaler
    tick never sends a second fetch beside a live one; what it writes, it writes only while it
    still holds that lease. At most URL_FETCH_MAX_IN_FLIGHT fetches run at once, so that slow
    hosts never hold every short-task worker; its slot, once it ends, goes to the next document
    in turn by owner (services/fetch_turns.py). Each fetch that starts is counted: after
    URL_FETCH_MAX_ATTEMPTS that never finished (killed, lost), the document fails instead."""
    document = _fetch_with_lease(document_id)
    fetches_start()  # its slot to the next in turn (a fetch that raised leaves it to the tick)
    return document


def _fetch_with_lease(document_id: int) -> Document:
    document = Document.objects.select_related("job").get(pk=document_id)
    if document.kind != Document.Kind.URL or document.job.status == Job.Status.CANCELLED:
        return document
    row = Document.objects.filter(pk=document_id, kind=Document.Kind.URL, status=Document.Status.PENDING)
    lease = leases.acquire(row)
    if lease is None:
        log.info("document %s: another task is fetching it", document_id)
        return document
    try:
        if document.fetch_attempts >= settings.URL_FETCH_MAX_ATTEMPTS:
            return _fetch_failed(document, row, lease, fetch_attempts_error(document.fetch_attempts))
        if fetches_in_flight(but=document_id) >= settings.URL_FETCH_MAX_IN_FLIGHT:
            # Every slot is held (by hosts that may be slow on purpose): this worker goes back to
            # other work; the lease, released below, lapses and the document waits for its turn.
            log.info(
                "document %s: %d fetches in flight already; it waits", document_id, settings.URL_FETCH_MAX_IN_FLIGHT
            )
            return document
        row.filter(task_lease_token=lease).update(fetch_attempts=F("fetch_attempts") + 1)
        return _fetch_and_split(document, row, lease)
    except leases.LeaseLost:
        log.warning("document %s: another task took over its fetch; this one wrote nothing", document_id)
        return Document.objects.get(pk=document_id)
    finally:
        leases.release(Document.objects.filter(pk=document_id), lease)


def fetches_in_flight(*, but: int) -> int:
    """URL documents a fetch holds the live lease of, deployment-wide (but one). A soft cap: two
    fetches that start at the same instant may both pass it."""
    held = Document.objects.filter(kind=Document.Kind.URL, status=Document.Status.PENDING,
                                   task_lease_until__gte=timezone.now()).exclude(task_lease_token="")  # fmt: skip
    return held.exclude(pk=but).count()


def fetch_attempts_error(attempts: int) -> str:
    return (
        f"the download was started {attempts} times and never finished (its worker was stopped, or the "
        "host held it past its time limit); it is not tried again"
    )


def fetches_exhausted(lost: QuerySet) -> set[int]:
    """Fail the URL documents in ``lost`` (lapsed leases) whose fetch started URL_FETCH_MAX_ATTEMPTS
    times: a host that holds every fetch until its worker is stopped never gets another. Their ids."""
    failed = set()
    exhausted = lost.filter(fetch_attempts__gte=settings.URL_FETCH_MAX_ATTEMPTS)
    for document_id, job_id, tries in exhausted.values_list("pk", "job_id", "fetch_attempts"):
        # Only if still lapsed (no fetch took it meanwhile), in one statement.
        if leases.expired(Document.objects.filter(pk=document_id, status=Document.Status.PENDING)).update(
            status=Document.Status.FAILED, error=fetch_attempts_error(tries)
        ):
            log.warning("document %s: %d fetches never finished; it fails", document_id, tries)
            job_refresh(job_id=job_id)
            failed.add(document_id)
    return failed


class _Renewal:
    """Renews the fetch's lease as the bytes come in (a third of its length at most apart)."""

    def __init__(self, row, lease: str):
        self.row, self.lease, self.at = row, lease, time.monotonic()

    def __call__(self, *, now: bool = False) -> None:
        if now or time.monotonic() - self.at >= settings.TASK_LEASE_SECONDS / 3:
            leases.renew(self.row, self.lease)
            self.at = time.monotonic()


def _fetch_and_split(document: Document, row, lease: str) -> Document:
    renewal = _Renewal(row, lease)
    staging = settings.MEDIA_ROOT / "staging" / uuid.uuid4().hex
    staging.mkdir(parents=True)
    try:
        staged = _fetch_to(document.url, staging, renewal)
        renewal(now=True)
        source = document_store(f"documents/{uuid.uuid4().hex}/source{staged.suffix}", staged.path)
    except DomainError as exc:
        log.info("document %s not fetched: %s", document.pk, exc.message)
        return _fetch_failed(document, row, lease, exc.message)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    fields = {"kind": staged.kind, "source": source, "size_bytes": staged.size, "page_count": staged.page_count,
              "sha256": staged.sha256, "task_lease_until": timezone.now() + timedelta(seconds=settings.TASK_LEASE_SECONDS)}  # fmt: skip
    if not row.filter(task_lease_token=lease).update(**fields):
        document_delete(source)  # superseded: another fetch owns the document now
        raise leases.LeaseLost("another task took over this document")
    for name, value in fields.items():
        setattr(document, name, value)
    return document_split(document_id=document.pk, lease=lease)


def _fetch_failed(document: Document, row, lease: str, error: str) -> Document:
    """The document fails with ``error``, if this fetch still holds its lease (else LeaseLost)."""
    if not row.filter(task_lease_token=lease).update(status=Document.Status.FAILED, error=error[:2000]):
        raise leases.LeaseLost("another task took over this document")
    document.status, document.error = Document.Status.FAILED, error[:2000]
    job_refresh(job_id=document.job_id)
    return document


def _fetch_to(url: str, staging: Path, progress) -> Staged:
    """Download ``url`` (following up to three redirects, each checked) into ``staging``, all of
    it within URL_FETCH_TIMEOUT_SECONDS and OCR_MAX_FILE_BYTES."""
    deadline = remote.Deadline(settings.URL_FETCH_TIMEOUT_SECONDS)
    for _ in range(4):  # the URL and up to three redirects
        with remote.exchange("GET", url, deadline=deadline, max_bytes=settings.OCR_MAX_FILE_BYTES,
                             headers={"User-Agent": "fleetadmin-fetch"}, progress=progress) as answer:  # fmt: skip
            if answer.status in (301, 302, 303, 307, 308) and answer.header("location"):
                url = urllib.parse.urljoin(url, answer.header("location"))
                continue
            if answer.status != 200:
                raise RemoteFailed(f"{remote.shown(url)}: the server answered HTTP {answer.status}")
            length = int(answer.header("content-length") or 0)
            if length > settings.OCR_MAX_FILE_BYTES:
                raise TooLarge(
                    f"{remote.shown(url)}: {length} bytes is larger than the limit of {settings.OCR_MAX_FILE_BYTES} bytes",
                )
            return stage_upload(Upload(name=name_from_url(url), file=_Response(answer.chunks)), staging, 0)
    raise RemoteFailed(f"{remote.shown(url)}: too many redirects")
