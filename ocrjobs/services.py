"""Jobs, documents and pages: submit, split, claim, complete, finish.

Submission runs in the front (it only reads the uploaded files); splitting and
everything about pages runs in workers.
"""

from __future__ import annotations

import io
import ipaddress
import json
import logging
import os
import re
import shutil
import socket
import time
import unicodedata
import urllib.parse
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import httpx
import pypdfium2 as pdfium
from django.conf import settings
from django.db import connection, transaction
from django.db.models import F
from django.utils import timezone
from PIL import Image

from fleetadmin import leases
from ocrjobs.models import Dispatcher, Document, Job, Page
from pods.models import Pool

log = logging.getLogger(__name__)

CHUNK = 1024 * 1024
SPLIT_BATCH = 25
LANGUAGE_RE = re.compile(r"^[a-z][a-z_]{1,30}(\+[a-z][a-z_]{1,30})*$")

# Pillow's own bomb guard raises for images over twice this; we check the size
# ourselves so that the error names the limit.
Image.MAX_IMAGE_PIXELS = None


class SubmissionError(Exception):
    """Bad input: a message for a person and the HTTP status that fits it."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.message = message
        self.status = status


@dataclass
class Upload:
    name: str
    file: IO[bytes]


@dataclass
class _Staged:
    name: str
    path: Path
    size: int
    kind: str
    suffix: str
    page_count: int


def clean_filename(name: str) -> str:
    """A display name without directories or control characters."""
    name = name.replace("\\", "/").rsplit("/", 1)[-1]
    name = "".join(ch for ch in unicodedata.normalize("NFC", name) if unicodedata.category(ch)[0] != "C")
    name = name.strip().lstrip(".")
    return name[:200] or "document"


def _sniff(head: bytes) -> tuple[str, str] | None:
    if head.startswith(b"%PDF-"):
        return Document.Kind.PDF, ".pdf"
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        return Document.Kind.IMAGE, ".png"
    if head.startswith(b"\xff\xd8\xff"):
        return Document.Kind.IMAGE, ".jpg"
    if head.startswith((b"II*\x00", b"MM\x00*")):
        return Document.Kind.IMAGE, ".tif"
    return None


def _stage(upload: Upload, directory: Path, index: int) -> _Staged:
    name = clean_filename(upload.name)
    path = directory / f"{index}"
    size = 0
    limit = settings.OCR_MAX_FILE_BYTES
    with open(path, "wb") as out:
        while chunk := upload.file.read(CHUNK):
            size += len(chunk)
            if size > limit:
                raise SubmissionError(f"{name}: the file is larger than the limit of {limit} bytes", 413)
            out.write(chunk)
    if size == 0:
        raise SubmissionError(f"{name}: the file is empty")
    with open(path, "rb") as f:
        sniffed = _sniff(f.read(8))
    if sniffed is None:
        raise SubmissionError(f"{name}: not a PDF, PNG, JPEG or TIFF file", 415)
    kind, suffix = sniffed
    pages = _count_pdf_pages(name, path) if kind == Document.Kind.PDF else _count_image_frames(name, path)
    if pages == 0:
        raise SubmissionError(f"{name}: the document has no pages")
    if pages > settings.OCR_MAX_PAGES_PER_DOCUMENT:
        raise SubmissionError(
            f"{name}: {pages} pages; the limit is {settings.OCR_MAX_PAGES_PER_DOCUMENT} pages per document", 413
        )
    return _Staged(name=name, path=path, size=size, kind=kind, suffix=suffix, page_count=pages)


def _count_pdf_pages(name: str, path: Path) -> int:
    try:
        pdf = pdfium.PdfDocument(str(path))
    except pdfium.PdfiumError as exc:
        if "password" in str(exc).lower():
            # PDFium also answers "incorrect password" for a PDF with no pages;
            # only a file with an encryption dictionary is really encrypted.
            if _has_encrypt_entry(path):
                raise SubmissionError(
                    f"{name}: the PDF is encrypted; remove its password and submit it again"
                ) from None
            raise SubmissionError(f"{name}: the document has no pages") from None
        raise SubmissionError(f"{name}: the PDF is corrupt and cannot be read ({exc})") from None
    try:
        pages = len(pdf)
        if pages > settings.OCR_MAX_PAGES_PER_DOCUMENT:
            return pages  # refused for its page count; no need to measure every page
        scale = settings.OCR_RENDER_DPI / 72
        for index in range(pages):
            width, height = pdf.get_page_size(index)
            pixels = int(width * scale) * int(height * scale)
            if pixels > settings.OCR_MAX_IMAGE_PIXELS:
                raise SubmissionError(
                    f"{name}: page {index + 1} would render at {int(width * scale)}×{int(height * scale)} pixels, "
                    f"over the limit of {settings.OCR_MAX_IMAGE_PIXELS} pixels",
                    413,
                )
        return pages
    finally:
        pdf.close()


def _has_encrypt_entry(path: Path) -> bool:
    """Whether the file names an encryption dictionary (its trailer or xref stream has /Encrypt)."""
    needle = b"/Encrypt"
    tail = b""
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            if needle in tail + chunk:
                return True
            tail = chunk[-len(needle) :]
    return False


def _check_pixels(name: str, image: Image.Image) -> None:
    width, height = image.size
    if width * height > settings.OCR_MAX_IMAGE_PIXELS:
        raise SubmissionError(
            f"{name}: {width}×{height} pixels is over the limit of {settings.OCR_MAX_IMAGE_PIXELS} pixels", 413
        )


def _count_image_frames(name: str, path: Path) -> int:
    try:
        with Image.open(path) as image:
            _check_pixels(name, image)
            frames = getattr(image, "n_frames", 1)
            image.verify()
        if frames > 1:
            with Image.open(path) as image:
                if image.format == "TIFF":
                    # Each TIFF frame has its own size: a small first frame
                    # must not let a huge second one through. Seeking reads
                    # only the frame's header.
                    for frame in range(1, frames):
                        image.seek(frame)
                        _check_pixels(name, image)
    except SubmissionError:
        raise
    except Exception as exc:  # Pillow raises many types for a broken file
        raise SubmissionError(f"{name}: the image is corrupt and cannot be read ({exc})") from None
    return frames


def resolve_pool(key: str | None) -> Pool:
    if not key:
        pool = Pool.objects.order_by("pk").first()
        if pool is None:
            raise SubmissionError("no pool is configured", 409)
        return pool
    try:
        return Pool.objects.get(key=key)
    except Pool.DoesNotExist:
        raise SubmissionError(f"unknown pool {key!r}", 404) from None


def resolve_languages(value: str | None) -> str:
    value = (value or "eng").strip()
    if not LANGUAGE_RE.match(value):
        raise SubmissionError(f"languages must look like 'eng' or 'eng+deu', not {value!r}")
    unknown = [lang for lang in value.split("+") if lang not in settings.OCR_LANGUAGES]
    if unknown:
        available = ", ".join(settings.OCR_LANGUAGES)
        raise SubmissionError(f"language {unknown[0]!r} is not available (available: {available})")
    return value


def job_submit(
    *,
    owner,
    uploads: list[Upload],
    pool_key: str | None = None,
    languages: str | None = None,
    urls: list[str] | None = None,
    skip_text_pages: bool = False,
) -> Job:
    """Check every file (and the form of every URL), then store the job and its documents in
    one transaction. URLs are fetched later by a worker, never by the front.

    Nothing is left behind on a bad file: no rows, no files on disk.
    """
    pool = resolve_pool(pool_key)
    languages = resolve_languages(languages)
    urls = [check_url(url) for url in (urls or []) if url.strip()]
    if not uploads and not urls:
        raise SubmissionError("no files: send at least one PDF or image, or a URL of one")
    if len(uploads) + len(urls) > settings.OCR_MAX_FILES_PER_JOB:
        count = len(uploads) + len(urls)
        raise SubmissionError(f"{count} documents; the limit is {settings.OCR_MAX_FILES_PER_JOB} per job", 413)
    staging = settings.MEDIA_ROOT / "staging" / uuid.uuid4().hex
    staging.mkdir(parents=True)
    job_dir: Path | None = None
    try:
        staged = [_stage(upload, staging, i) for i, upload in enumerate(uploads)]
        with transaction.atomic():
            job = Job.objects.create(owner=owner if owner and owner.is_authenticated else None, pool=pool,
                                     languages=languages, skip_text_pages=skip_text_pages)  # fmt: skip
            job_dir = settings.MEDIA_ROOT / "jobs" / str(job.pk)
            documents = []
            for position, item in enumerate(staged):
                source = f"jobs/{job.pk}/{position}/source{item.suffix}"
                (settings.MEDIA_ROOT / source).parent.mkdir(parents=True, exist_ok=True)
                os.replace(item.path, settings.MEDIA_ROOT / source)
                documents.append(
                    Document(
                        job=job,
                        position=position,
                        name=item.name,
                        kind=item.kind,
                        source=source,
                        size_bytes=item.size,
                        page_count=item.page_count,
                        **leases.queued(),
                    )  # fmt: skip
                )
            for offset, url in enumerate(urls):
                documents.append(
                    Document(
                        job=job,
                        position=len(staged) + offset,
                        name=_name_from_url(url),
                        kind=Document.Kind.URL,
                        url=url,
                        source="",
                        size_bytes=0,
                        page_count=0,
                        **leases.queued(),
                    )  # fmt: skip
                )
            Document.objects.bulk_create(documents)
            split_ids = list(job.documents.exclude(kind=Document.Kind.URL).values_list("pk", flat=True))
            fetch_ids = list(job.documents.filter(kind=Document.Kind.URL).values_list("pk", flat=True))
            transaction.on_commit(lambda: _enqueue_splits(split_ids))
            transaction.on_commit(lambda: _enqueue_fetches(fetch_ids))
    except BaseException:
        if job_dir is not None:
            shutil.rmtree(job_dir, ignore_errors=True)
        raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    log.info("job %s submitted: %d documents, %d pages", job.pk, len(staged), sum(s.page_count for s in staged))
    return job


def _name_from_url(url: str) -> str:
    path = urllib.parse.urlsplit(url).path
    return clean_filename(urllib.parse.unquote(path.rsplit("/", 1)[-1])) if path.strip("/") else "document"


def _address_allowed(address: str) -> bool:
    if settings.URL_FETCH_ALLOW_PRIVATE:
        return True
    ip = ipaddress.ip_address(address)
    return ip.is_global and not ip.is_multicast


def check_url(url: str) -> str:
    """What can be checked without the network (the front never resolves or fetches):
    http(s) only, a host, no literal private or loopback address."""
    url = url.strip()
    if len(url) > 2000:
        raise SubmissionError("a URL is longer than 2,000 characters")
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise SubmissionError(f"{url[:100]}: only http and https URLs can be fetched")
    host = parts.hostname
    if not host:
        raise SubmissionError(f"{url[:100]}: the URL has no host")
    try:
        parts.port  # noqa: B018 (raises on a bad port)
    except ValueError:
        raise SubmissionError(f"{url[:100]}: the port is not a number") from None
    if settings.URL_FETCH_ALLOW_PRIVATE:
        return url
    if host == "localhost" or host.endswith((".localhost", ".local", ".internal")):
        raise SubmissionError(f"{url[:100]}: private and loopback addresses are refused")
    try:
        literal = ipaddress.ip_address(host)
    except ValueError:
        return url  # a name: resolved and checked by the worker that fetches it
    if not _address_allowed(str(literal)):
        raise SubmissionError(f"{url[:100]}: private and loopback addresses are refused")
    return url


def _enqueue_fetches(document_ids: list[int]) -> None:
    from django_q.tasks import async_task

    for document_id in document_ids:
        async_task("ocrjobs.tasks.fetch_document", document_id, task_name=f"fetch document {document_id}",
                   group="splits")  # fmt: skip


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
                raise SubmissionError(f"the download took longer than {settings.URL_FETCH_TIMEOUT_SECONDS:.0f} s")
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
        source = f"jobs/{document.job_id}/{document.position}/source{staged.suffix}"
        (settings.MEDIA_ROOT / source).parent.mkdir(parents=True, exist_ok=True)
        os.replace(staged.path, settings.MEDIA_ROOT / source)
    except SubmissionError as exc:
        log.info("document %s (%s) not fetched: %s", document.pk, document.url, exc.message)
        document.status = Document.Status.FAILED
        document.error = exc.message[:2000]
        document.save(update_fields=["status", "error"])
        job_refresh(job_id=document.job_id)
        return document
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    document.kind, document.source = staged.kind, source
    document.size_bytes, document.page_count = staged.size, staged.page_count
    document.save(update_fields=["kind", "source", "size_bytes", "page_count"])
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
            raise SubmissionError(f"{parts.hostname}: the name does not resolve ({exc.strerror})") from None
        if not addresses or not all(_address_allowed(address) for address in addresses):
            raise SubmissionError(f"{parts.hostname}: resolves to a private or loopback address; refused")
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
                    raise SubmissionError(f"{url[:100]}: the server answered HTTP {response.status_code}")
                length = int(response.headers.get("content-length") or 0)
                if length > settings.OCR_MAX_FILE_BYTES:
                    raise SubmissionError(
                        f"{url[:100]}: {length} bytes is larger than the limit of {settings.OCR_MAX_FILE_BYTES} bytes",
                        413,
                    )
                body = _Response(response.iter_bytes(CHUNK), deadline)
                return _stage(Upload(name=_name_from_url(url), file=body), staging, 0)
        except httpx.HTTPError as exc:
            raise SubmissionError(f"{url[:100]}: the download failed ({exc.__class__.__name__}: {exc})") from None
    raise SubmissionError(f"{url[:100]}: too many redirects")


def _enqueue_splits(document_ids: list[int]) -> None:
    from django_q.tasks import async_task

    for document_id in document_ids:
        async_task("ocrjobs.tasks.split_document", document_id, task_name=f"split document {document_id}",
                   group="splits")  # fmt: skip


def document_split(*, document_id: int, lease: str | None = None) -> Document:
    """Render a document's pages to images and create their rows, a batch at a time.

    Pages become claimable batch by batch, so OCR starts before a long PDF is
    fully split. Run again after a crash, it makes only the pages still missing.
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
    pages_dir = document.source_path.parent / "pages"
    pages_dir.mkdir(parents=True, exist_ok=True)
    existing = set(document.pages.values_list("number", flat=True))
    try:
        renderer = _PageRenderer(document)
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
                _save_pages(document, batch)
                batch = []
                if not nudged:
                    # The first pages can be read while the rest are rendered.
                    _nudge(document.job.pool_id)
                    nudged = True
        leases.renew(row, lease)
        _save_pages(document, batch)
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
    _enqueue_fetches(fetches)
    _enqueue_splits(splits)
    return [pk for pk, _ in documents]


def _save_pages(document: Document, pages: list[Page]) -> None:
    if not pages:
        return
    Page.objects.bulk_create(pages, ignore_conflicts=True)
    Job.objects.filter(pk=document.job_id, status=Job.Status.QUEUED).update(status=Job.Status.RUNNING)


TEXT_LAYER_MIN_CHARS = 20


def _keep_text_layer(page: Page, document: Document, text: str) -> None:
    """A page whose PDF already has text keeps it: done without a pod, confidence 100."""
    result = {"text": text, "lines": [], "confidence": 100.0, "width": None, "height": None, "source": "text layer"}
    results_dir = settings.MEDIA_ROOT / "jobs" / str(document.job_id) / str(document.position) / "results"
    results_dir.mkdir(parents=True, exist_ok=True)
    path = results_dir / f"text-layer-{page.number}.json"
    path.write_text(json.dumps(result, ensure_ascii=False))
    page.result = str(path.relative_to(settings.MEDIA_ROOT))
    page.status = Page.Status.DONE
    page.confidence = 100.0
    page.seconds = 0.0
    page.finished_at = timezone.now()


class _PageRenderer:
    def __init__(self, document: Document):
        self.document = document
        self.pdf = None
        self.image = None
        if document.kind == Document.Kind.PDF:
            self.pdf = pdfium.PdfDocument(str(document.source_path))
        else:
            self.image = Image.open(document.source_path)
            self.frames = getattr(self.image, "n_frames", 1)

    def render(self, number: int, pages_dir: Path) -> str:
        relative = pages_dir.relative_to(settings.MEDIA_ROOT) / f"{number}.png"
        if self.pdf is not None:
            page = self.pdf[number - 1]
            try:
                bitmap = page.render(scale=settings.OCR_RENDER_DPI / 72, grayscale=True)
                bitmap.to_pil().save(settings.MEDIA_ROOT / relative, compress_level=1)
            finally:
                page.close()
            return str(relative)
        if self.frames == 1 and self.image.format in ("PNG", "JPEG"):
            # Taken as it is: the pod reads PNG and JPEG directly.
            self.image.load()
            return self.document.source
        self.image.seek(number - 1)
        frame = self.image.convert("L") if self.image.mode not in ("L", "RGB") else self.image
        frame.save(settings.MEDIA_ROOT / relative, compress_level=1)
        return str(relative)

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


# --- jobs -------------------------------------------------------------------


def job_refresh(*, job_id: int) -> Job:
    """Finish the job once every document is split and every page has ended."""
    with transaction.atomic():
        job = Job.objects.select_for_update().get(pk=job_id)
        if job.is_finished:
            return job
        if job.documents.filter(status=Document.Status.PENDING).exists():
            return job
        counts = job.page_counts()
        if counts["pending"] or counts["running"]:
            if job.status == Job.Status.QUEUED:
                job.status = Job.Status.RUNNING
                job.save(update_fields=["status"])
            return job
        failed_documents = job.documents.filter(status=Document.Status.FAILED).exists()
        if counts["done"] == 0:
            job.status = Job.Status.FAILED
        elif counts["failed"] or failed_documents:
            job.status = Job.Status.PARTIAL
        else:
            job.status = Job.Status.DONE
        job.finished_at = timezone.now()
        job.save(update_fields=["status", "finished_at"])
    log.info("job %s finished: %s %s", job.pk, job.status, counts)
    return job


def job_cancel(*, job: Job) -> Job:
    with transaction.atomic():
        job = Job.objects.select_for_update().get(pk=job.pk)
        if job.is_finished:
            return job
        now = timezone.now()
        job.pages.filter(status__in=[Page.Status.PENDING, Page.Status.RUNNING]).update(
            status=Page.Status.CANCELLED, claim_token="", claim_expires_at=None, finished_at=now
        )
        job.status = Job.Status.CANCELLED
        job.finished_at = now
        job.save(update_fields=["status", "finished_at"])
    return job


def job_retry_failed(*, job: Job) -> int:
    """Give failed pages a fresh set of attempts; the job runs again."""
    with transaction.atomic():
        job = Job.objects.select_for_update().get(pk=job.pk)
        if job.status not in (Job.Status.PARTIAL, Job.Status.FAILED):
            return 0
        retried = job.pages.filter(status=Page.Status.FAILED, image__gt="").update(
            status=Page.Status.PENDING, attempts=0, error="", finished_at=None
        )
        if retried:
            job.status = Job.Status.RUNNING
            job.finished_at = None
            job.save(update_fields=["status", "finished_at"])
            transaction.on_commit(lambda: _nudge(job.pool_id))
    return retried


def _nudge(pool_id: int) -> None:
    from pods.tasks import nudge_scaler

    nudge_scaler(pool_id)


# --- pages (called by dispatchers) -------------------------------------------


@dataclass(frozen=True)
class ClaimedPage:
    id: int
    job_id: int
    position: int  # of its document in the job: where its result file goes
    image: str
    languages: str
    attempts: int


def pages_claim(*, pool_id: int, token: str, limit: int, sweep: bool = True) -> list[ClaimedPage]:
    """Claim up to ``limit`` waiting pages with a lease that expires unless renewed.

    ``sweep`` also fails the pages whose claims expired on their last attempt;
    a dispatcher asks for it every few seconds rather than on every claim.
    """
    if limit <= 0:
        return []
    now = timezone.now()
    expires = now + timezone.timedelta(seconds=settings.PAGE_CLAIM_SECONDS)
    with transaction.atomic():
        if sweep:
            _fail_exhausted(pool_id=pool_id)
        query = Page.objects.waiting().filter(pool_id=pool_id).order_by("id")
        if connection.features.has_select_for_update_skip_locked:
            query = query.select_for_update(skip_locked=True, of=("self",))
        ids = list(query.values_list("id", flat=True)[:limit])
        if not ids:
            return []
        Page.objects.filter(id__in=ids).update(
            status=Page.Status.RUNNING,
            claim_token=token,
            claim_expires_at=expires,
            attempts=F("attempts") + 1,
            started_at=now,
            pod=None,
        )
        rows = Page.objects.filter(id__in=ids).values_list(
            "id", "job_id", "document__position", "image", "job__languages", "attempts"
        )
        return [ClaimedPage(*row) for row in rows]


def _fail_exhausted(*, pool_id: int) -> None:
    """Pages whose claims expired on their last attempt fail instead of looping."""
    now = timezone.now()
    exhausted = Page.objects.filter(
        pool_id=pool_id, status=Page.Status.RUNNING, claim_expires_at__lt=now,
        attempts__gte=settings.PAGE_MAX_ATTEMPTS,
    )  # fmt: skip
    job_ids = set(exhausted.values_list("job_id", flat=True))
    if job_ids:
        exhausted.update(
            status=Page.Status.FAILED,
            error=f"no result after {settings.PAGE_MAX_ATTEMPTS} attempts (claims expired)",
            finished_at=now,
            claim_token="",
        )
        for job_id in job_ids:
            transaction.on_commit(lambda job_id=job_id: job_refresh(job_id=job_id))


def claims_renew(*, token: str, page_ids: list[int] | None = None) -> int:
    """Extend the claims of this token (all its running pages, or the given ones)."""
    expires = timezone.now() + timezone.timedelta(seconds=settings.PAGE_CLAIM_SECONDS)
    pages = Page.objects.filter(claim_token=token, status=Page.Status.RUNNING)
    if page_ids is not None:
        pages = pages.filter(id__in=page_ids)
    return pages.update(claim_expires_at=expires)


def pages_assign_pods(*, token: str, assignments: list[tuple[int, int, int]]) -> None:
    """Record which pod each running page went to (one statement for many pages),
    so that a pod that goes away sends its pages back to the queue at once.

    ``assignments`` are (page id, attempt, pod id): a superseded attempt records nothing.
    """
    if not assignments:
        return
    table = Page._meta.db_table
    placeholders = ", ".join(["(CAST(%s AS bigint), CAST(%s AS integer), CAST(%s AS bigint))"] * len(assignments))
    params = [value for row in assignments for value in row] + [token, Page.Status.RUNNING]
    sql = (
        f"WITH v(id, attempts, pod_id) AS (VALUES {placeholders}) UPDATE {table} SET pod_id = v.pod_id "
        f"FROM v WHERE {table}.id = v.id AND {table}.attempts = v.attempts "
        f"AND {table}.claim_token = %s AND {table}.status = %s"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, params)


@dataclass(frozen=True)
class PageResult:
    page_id: int
    job_id: int
    position: int
    pod_id: int | None
    result: dict
    seconds: float | None = None  # how long the pod took: the busy time that its spend is shared by
    attempt: int | None = None  # the claim's attempt number; None: whichever attempt holds the claim


def _write_result(item: PageResult, token: str) -> str:
    """Write a result file named for its claim (token and attempt): another claim's writer
    can never overwrite it, and the same claim's writer trying again after a database
    error writes the same file, not a second one. Written whole, then renamed into place."""
    results_dir = settings.MEDIA_ROOT / "jobs" / str(item.job_id) / str(item.position) / "results"
    results_dir.mkdir(parents=True, exist_ok=True)
    claim = f"{item.attempt}-{token[:12]}" if item.attempt is not None else uuid.uuid4().hex[:12]
    path = results_dir / f"{item.page_id}-{claim}.json"
    partial = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}")
    partial.write_text(json.dumps(item.result, ensure_ascii=False))
    os.replace(partial, path)
    return str(path.relative_to(settings.MEDIA_ROOT))


def _confidence(result: dict) -> float | None:
    value = result.get("confidence")
    try:
        return float(value) if value is not None else None
    except (TypeError, ValueError):
        return None


def pages_complete(*, token: str, items: list[PageResult]) -> set[int]:
    """Store many pages' results at once; each only if its claim is still ours.

    Result files are written first, then one UPDATE marks the pages done; a page
    whose claim was lost (expired and taken, cancelled, or superseded by a newer
    attempt) is not updated and its file is removed, so a page is never written
    twice. Of two results for one page in a batch, the first counts. Returns the
    stored ids.
    """
    unique: dict[int, PageResult] = {}
    for item in items:
        unique.setdefault(item.page_id, item)
    if not unique:
        return set()
    paths = {page_id: _write_result(item, token) for page_id, item in unique.items()}
    placeholders = ", ".join(
        ["(CAST(%s AS bigint), CAST(%s AS integer), CAST(%s AS text), CAST(%s AS double precision),"
         " CAST(%s AS bigint), CAST(%s AS double precision))"] * len(unique)
    )  # fmt: skip
    params: list = []
    for page_id, item in unique.items():
        params += [page_id, item.attempt, paths[page_id], _confidence(item.result), item.pod_id, item.seconds]
    table = Page._meta.db_table
    sql = (
        f"WITH v(id, attempts, result, confidence, pod_id, seconds) AS (VALUES {placeholders}) "
        f"UPDATE {table} SET status = %s, result = v.result, confidence = v.confidence, pod_id = v.pod_id, "
        f"seconds = v.seconds, "
        f"error = '', claim_token = '', claim_expires_at = NULL, finished_at = %s "
        f"FROM v WHERE {table}.id = v.id AND {table}.attempts = COALESCE(v.attempts, {table}.attempts) "
        f"AND {table}.claim_token = %s AND {table}.status = %s "
        f"RETURNING {table}.id"
    )
    params += [Page.Status.DONE, timezone.now(), token, Page.Status.RUNNING]
    # On a database error the files stay: whether the commit happened is unknown. Called
    # again, this writes the same files (named for their claims) and sorts them out.
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(sql, params)
        stored = {row[0] for row in cursor.fetchall()}
    refused = {page_id: relative for page_id, relative in paths.items() if page_id not in stored}
    if refused:
        # Not stored now, but maybe by this same call before a database error cut off its
        # answer: a file that a page refers to stays.
        kept = set(Page.objects.filter(pk__in=refused, result__in=refused.values()).values_list("result", flat=True))
        for relative in set(refused.values()) - kept:
            (settings.MEDIA_ROOT / relative).unlink(missing_ok=True)
    return stored


def page_complete(*, page_id: int, token: str, pod_id: int | None, result: dict) -> bool:
    """Store one page's result once. False if the claim was lost (expired, cancelled, done elsewhere)."""
    page = Page.objects.filter(pk=page_id).values("job_id", "document__position").first()
    if page is None:
        return False
    item = PageResult(page_id, page["job_id"], page["document__position"], pod_id, result)
    return page_id in pages_complete(token=token, items=[item])


def page_attempt_failed(
    *, page_id: int, token: str, pod_id: int | None, error: str, final: bool = False, attempt: int | None = None
) -> str:
    """Record a failed attempt: the page waits for another, or fails when they are spent.
    ``attempt`` names the claim that failed; a superseded one changes nothing ("lost")."""
    claim = Page.objects.filter(pk=page_id, claim_token=token, status=Page.Status.RUNNING)
    if attempt is not None:
        claim = claim.filter(attempts=attempt)
    page = claim.first()
    if page is None:
        return "lost"
    claim = claim.filter(attempts=page.attempts)
    if final or page.attempts >= settings.PAGE_MAX_ATTEMPTS:
        claim.update(
            status=Page.Status.FAILED, error=error[:2000], pod_id=pod_id, claim_token="",
            claim_expires_at=None, finished_at=timezone.now(),
        )  # fmt: skip
        return "failed"
    claim.update(status=Page.Status.PENDING, error=error[:2000], claim_token="", claim_expires_at=None)
    return "retry"


def pages_unclaim(*, token: str, page_ids: list[int]) -> int:
    """Give pages back without spending an attempt (no lane for them, or shutting down)."""
    return Page.objects.filter(id__in=page_ids, claim_token=token, status=Page.Status.RUNNING).update(
        status=Page.Status.PENDING, claim_token="", claim_expires_at=None, attempts=F("attempts") - 1
    )


def pages_requeue_from_pod(*, pod_id: int) -> int:
    """A pod went away: its pages in flight wait again (the attempt stays counted)."""
    return Page.objects.filter(pod_id=pod_id, status=Page.Status.RUNNING).update(
        status=Page.Status.PENDING, claim_token="", claim_expires_at=None
    )


# --- dispatchers ------------------------------------------------------------


def dispatch_ensure(*, pool: Pool) -> bool:
    """Start a dispatcher for the pool unless enough are alive. True if one was enqueued."""
    if Dispatcher.objects.live().filter(pool=pool).count() >= settings.DISPATCHERS_PER_POOL:
        return False
    from django_q.tasks import async_task

    transaction.on_commit(
        lambda: async_task(
            "ocrjobs.tasks.dispatch_pool", pool.pk, task_name=f"dispatch pool {pool.key}", group="dispatch"
        )  # fmt: skip
    )
    return True


def dispatcher_register(*, pool_id: int) -> Dispatcher | None:
    """Take a dispatcher slot for the pool, or None when enough are alive."""
    with transaction.atomic():
        Pool.objects.select_for_update().filter(pk=pool_id).first()  # serialises registration on PostgreSQL
        if Dispatcher.objects.live().filter(pool_id=pool_id).count() >= settings.DISPATCHERS_PER_POOL:
            return None
        return Dispatcher.objects.create(
            pool_id=pool_id, token=uuid.uuid4().hex, host=socket.gethostname(), pid=os.getpid()
        )


def dispatcher_end(*, dispatcher: Dispatcher) -> None:
    Dispatcher.objects.filter(pk=dispatcher.pk).update(ended_at=timezone.now())


def pages_waiting(*, pool_id: int) -> int:
    return Page.objects.waiting().filter(pool_id=pool_id).count()
