"""URL documents, fetched by a worker (never the front): every address the name resolves to
is checked, the download is pinned to the checked address, redirects are checked the same
way, the size and time limits hold; then the file is staged like an upload and split.
"""

from __future__ import annotations

import io
import logging
import shutil
import socket
import time
import urllib.parse
import uuid
from pathlib import Path

import httpx
from django.conf import settings

from fleetadmin import leases
from fleetadmin.api import ApiError
from ocrjobs.models import Document, Job
from ocrjobs.services.jobs import job_refresh
from ocrjobs.services.split import document_split
from ocrjobs.services.submission import CHUNK, Upload, _stage, _Staged, name_from_url
from ocrjobs.services.urls import address_allowed, check_url
from ocrjobs.storage import document_store

log = logging.getLogger(__name__)


class _Response(io.RawIOBase):
    """A streamed HTTP body as a file, stopping at the time limit."""

    def __init__(self, chunks, deadline: float):
        self.chunks = chunks
        self.deadline = deadline
        self.buffer = b""

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        while size < 0 or len(self.buffer) < size:
            if time.monotonic() > self.deadline:
                raise ApiError(f"the download took longer than {settings.URL_FETCH_TIMEOUT_SECONDS:.0f} s")
            chunk = next(self.chunks, b"")
            if not chunk:
                break
            self.buffer += chunk
        data, self.buffer = (self.buffer, b"") if size < 0 else (self.buffer[:size], self.buffer[size:])
        return data


def document_fetch(*, document_id: int) -> Document:
    """Fetch a URL document (in a worker): every address the name resolves to must be public,
    redirects are checked the same way, the size and time limits hold; then it is checked
    like an upload and split. A bad URL fails its document, not the job."""
    document = Document.objects.select_related("job").get(pk=document_id)
    if document.kind != Document.Kind.URL or document.job.status == Job.Status.CANCELLED:
        return document
    row = Document.objects.filter(pk=document_id, kind=Document.Kind.URL, status=Document.Status.PENDING)
    # The download has its own time limit; the lease outlasts it.
    lease = leases.acquire(row, seconds=settings.URL_FETCH_TIMEOUT_SECONDS + settings.TASK_LEASE_SECONDS)
    if lease is None:
        log.info("document %s: another task is fetching it", document_id)
        return document
    try:
        return _fetch_and_split(document, lease)
    finally:
        leases.release(Document.objects.filter(pk=document_id), lease)


def _fetch_and_split(document: Document, lease: str) -> Document:
    staging = settings.MEDIA_ROOT / "staging" / uuid.uuid4().hex
    staging.mkdir(parents=True)
    try:
        staged = _fetch_to(document.url, staging)
        source = document_store(f"documents/{uuid.uuid4().hex}/source{staged.suffix}", staged.path)
    except ApiError as exc:
        log.info("document %s (%s) not fetched: %s", document.pk, document.url, exc.message)
        document.status = Document.Status.FAILED
        document.error = exc.message[:2000]
        document.save(update_fields=["status", "error"])
        job_refresh(job_id=document.job_id)
        return document
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    document.kind, document.source = staged.kind, source
    document.size_bytes, document.page_count, document.sha256 = staged.size, staged.page_count, staged.sha256
    document.save(update_fields=["kind", "source", "size_bytes", "page_count", "sha256"])
    return document_split(document_id=document.pk, lease=lease)


def _pinned(url: str, address: str) -> tuple[httpx.URL, dict]:
    """The request for ``url`` sent to the address that was checked, so that a name which resolves
    differently the second time (DNS rebinding) cannot lead the download to a private address.
    The name still goes in the Host header and, for https, in the TLS handshake (SNI), where the
    certificate is checked against it."""
    original = httpx.URL(url)
    default_port = {"http": 80, "https": 443}[original.scheme]
    host = original.host if original.port in (None, default_port) else f"{original.host}:{original.port}"
    extensions = {"sni_hostname": original.host} if original.scheme == "https" else {}
    return original.copy_with(host=address), {"headers": {"Host": host}, "extensions": extensions}


def _fetch_to(url: str, staging: Path) -> _Staged:
    deadline = time.monotonic() + settings.URL_FETCH_TIMEOUT_SECONDS
    for _ in range(4):  # the URL and up to three redirects
        check_url(url)
        parts = urllib.parse.urlsplit(url)
        try:
            addresses = [info[4][0] for info in socket.getaddrinfo(parts.hostname, parts.port or None)]
        except socket.gaierror as exc:
            raise ApiError(f"{parts.hostname}: the name does not resolve ({exc.strerror})") from None
        if not addresses or not all(address_allowed(address) for address in addresses):
            raise ApiError(f"{parts.hostname}: resolves to a private or loopback address; refused")
        timeout = httpx.Timeout(settings.URL_FETCH_TIMEOUT_SECONDS, connect=10.0)
        target, pinning = _pinned(url, addresses[0])
        try:
            with (
                httpx.Client(timeout=timeout, follow_redirects=False) as client,
                client.stream("GET", target, **pinning) as response,
            ):
                if response.is_redirect:
                    url = urllib.parse.urljoin(url, response.headers.get("location", ""))
                    continue
                if response.status_code != 200:
                    raise ApiError(f"{url[:100]}: the server answered HTTP {response.status_code}")
                length = int(response.headers.get("content-length") or 0)
                if length > settings.OCR_MAX_FILE_BYTES:
                    raise ApiError(
                        f"{url[:100]}: {length} bytes is larger than the limit of {settings.OCR_MAX_FILE_BYTES} bytes",
                        413,
                    )
                body = _Response(response.iter_bytes(CHUNK), deadline)
                return _stage(Upload(name=name_from_url(url), file=body), staging, 0)
        except httpx.HTTPError as exc:
            raise ApiError(f"{url[:100]}: the download failed ({exc.__class__.__name__}: {exc})") from None
    raise ApiError(f"{url[:100]}: too many redirects")
