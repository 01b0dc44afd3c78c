"""Submission, in the front: every upload is sniffed, staged and checked against the limits
(size, pages, pixels), URLs only for their form; then the job and its documents are stored in
one transaction. The front only reads the uploaded files: it never resolves or fetches a URL.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import logging
import os
import re
import shutil
import unicodedata
import urllib.parse
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import IO

import pypdfium2 as pdfium
from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone
from PIL import Image, JpegImagePlugin, PngImagePlugin, TiffImagePlugin

from fleetadmin import leases
from fleetadmin.api import ApiError
from ocrjobs.models import Document, Job, SubmissionKey
from pods.models import Pool

log = logging.getLogger(__name__)

CHUNK = 1024 * 1024
LANGUAGE_RE = re.compile(r"^[a-z][a-z_]{1,30}(\+[a-z][a-z_]{1,30})*$")


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


# The reader of each format _sniff knows. Image.open checks the size against Pillow's own limit
# (Image.MAX_IMAGE_PIXELS) and raises, for an image over twice it, before our check could name
# ours; a format's reader reads the header and checks nothing. Pillow's limit is a global of the
# whole process (every thread, every library): it is left as it is.
_READERS = {
    ".png": PngImagePlugin.PngImageFile,
    ".jpg": JpegImagePlugin.jpeg_factory,
    ".tif": TiffImagePlugin.TiffImageFile,
}


def open_image(path: Path) -> Image.Image:
    """The image at ``path``, opened (its header read) without Pillow's size check: the
    caller checks the size against OCR_MAX_IMAGE_PIXELS (``_check_pixels``)."""
    with open(path, "rb") as f:
        sniffed = _sniff(f.read(8))
    reader = _READERS.get(sniffed[1]) if sniffed else None
    if reader is not None:
        try:
            return reader(path)
        except Exception:
            pass  # Image.open tries every reader, and says what is wrong as it always has
    return Image.open(path)


def _stage(upload: Upload, directory: Path, index: int) -> _Staged:
    name = clean_filename(upload.name)
    path = directory / f"{index}"
    size = 0
    limit = settings.OCR_MAX_FILE_BYTES
    with open(path, "wb") as out:
        while chunk := upload.file.read(CHUNK):
            size += len(chunk)
            if size > limit:
                raise ApiError(f"{name}: the file is larger than the limit of {limit} bytes", 413)
            out.write(chunk)
    if size == 0:
        raise ApiError(f"{name}: the file is empty")
    with open(path, "rb") as f:
        sniffed = _sniff(f.read(8))
    if sniffed is None:
        raise ApiError(f"{name}: not a PDF, PNG, JPEG or TIFF file", 415)
    kind, suffix = sniffed
    pages = _count_pdf_pages(name, path) if kind == Document.Kind.PDF else _count_image_frames(name, path)
    if pages == 0:
        raise ApiError(f"{name}: the document has no pages")
    if pages > settings.OCR_MAX_PAGES_PER_DOCUMENT:
        raise ApiError(
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
                raise ApiError(f"{name}: the PDF is encrypted; remove its password and submit it again") from None
            raise ApiError(f"{name}: the document has no pages") from None
        raise ApiError(f"{name}: the PDF is corrupt and cannot be read ({exc})") from None
    try:
        pages = len(pdf)
        if pages > settings.OCR_MAX_PAGES_PER_DOCUMENT:
            return pages  # refused for its page count; no need to measure every page
        scale = settings.OCR_RENDER_DPI / 72
        for index in range(pages):
            width, height = pdf.get_page_size(index)
            pixels = int(width * scale) * int(height * scale)
            if pixels > settings.OCR_MAX_IMAGE_PIXELS:
                raise ApiError(
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
        raise ApiError(
            f"{name}: {width}×{height} pixels is over the limit of {settings.OCR_MAX_IMAGE_PIXELS} pixels", 413
        )


def _count_image_frames(name: str, path: Path) -> int:
    try:
        with open_image(path) as image:
            _check_pixels(name, image)
            frames = getattr(image, "n_frames", 1)
            image.verify()
        if frames > 1:
            with open_image(path) as image:
                if image.format == "TIFF":
                    # Each TIFF frame has its own size: a small first frame
                    # must not let a huge second one through. Seeking reads
                    # only the frame's header.
                    for frame in range(1, frames):
                        image.seek(frame)
                        _check_pixels(name, image)
    except ApiError:
        raise
    except Exception as exc:  # Pillow raises many types for a broken file
        raise ApiError(f"{name}: the image is corrupt and cannot be read ({exc})") from None
    return frames


def resolve_pool(key: str | None) -> Pool:
    if not key:
        pool = Pool.objects.order_by("pk").first()
        if pool is None:
            raise ApiError("no pool is configured", 409)
        return pool
    try:
        return Pool.objects.get(key=key)
    except Pool.DoesNotExist:
        raise ApiError(f"unknown pool {key!r}", 404) from None


def resolve_languages(value: str | None) -> str:
    """The language list, checked strictly (API, form and CLI alike): None means ``eng``; anything
    else must be codes joined by ``+`` and each one installed. Never trimmed into something else."""
    value = "eng" if value is None else value.strip()
    if not LANGUAGE_RE.fullmatch(value):
        raise ApiError(f"languages must look like 'eng' or 'eng+deu', not {value!r}")
    unknown = [lang for lang in value.split("+") if lang not in settings.OCR_LANGUAGES]
    if unknown:
        available = ", ".join(settings.OCR_LANGUAGES)
        raise ApiError(f"language {unknown[0]!r} is not available (available: {available})")
    return value


MAX_DEADLINE_DAYS = 30
MAX_JOB_DOLLARS = Decimal("100000")


@dataclass(frozen=True)
class Schedule:
    """A job's budget and urgency, checked: what the API, the form and the CLI all pass on."""

    max_dollars: Decimal | None = None
    deadline: datetime | None = None
    priority: str = Job.Priority.BALANCED


def resolve_schedule(
    *, max_dollars: object = None, deadline: object = None, priority: object = None, now: datetime | None = None
) -> Schedule:
    """Check a job's budget (dollars, more than 0, cents at most), its deadline (ISO 8601 with a
    time zone, in the future, within 30 days) and its priority (fastest, balanced, cheapest);
    a deadline and a priority other than balanced exclude each other. Strings are parsed (the
    form and multipart send strings); anything else malformed is refused with 400."""
    dollars = None
    if max_dollars not in (None, ""):
        if isinstance(max_dollars, bool):
            raise ApiError("max_dollars must be a number of dollars, e.g. 12.50")
        try:
            dollars = Decimal(str(max_dollars).strip())
        except InvalidOperation:
            raise ApiError(
                f"max_dollars must be a number of dollars, e.g. 12.50, not {str(max_dollars)[:20]!r}"
            ) from None
        if not dollars.is_finite() or dollars <= 0 or dollars > MAX_JOB_DOLLARS:
            raise ApiError(f"max_dollars must be more than 0 and at most {MAX_JOB_DOLLARS}")
        if dollars != dollars.quantize(Decimal("0.01")):
            raise ApiError("max_dollars has at most two decimal places (cents)")
    when = None
    if deadline not in (None, ""):
        if isinstance(deadline, datetime):
            when = deadline
        else:
            try:
                when = datetime.fromisoformat(str(deadline).strip())
            except ValueError:
                raise ApiError(
                    f"deadline must be an ISO 8601 time, e.g. 2026-12-01T14:00:00Z, not {str(deadline)[:40]!r}"
                ) from None
        if when.tzinfo is None:
            raise ApiError("deadline needs a time zone, e.g. 2026-12-01T14:00:00Z or +01:00")
        now = now or timezone.now()
        if when <= now:
            raise ApiError(f"deadline {when.isoformat()} is in the past")
        if when > now + timedelta(days=MAX_DEADLINE_DAYS):
            raise ApiError(f"deadline is more than {MAX_DEADLINE_DAYS} days away")
    chosen = Job.Priority.BALANCED if priority in (None, "") else priority
    if chosen not in Job.Priority.values:
        raise ApiError(f"priority must be fastest, balanced or cheapest, not {str(priority)[:20]!r}")
    if when is not None and chosen != Job.Priority.BALANCED:
        raise ApiError("give a deadline or a priority, not both: a deadline sizes the pool to meet it")
    return Schedule(max_dollars=dollars, deadline=when, priority=chosen)


def job_submit(
    *,
    owner,
    uploads: list[Upload],
    pool_key: str | None = None,
    languages: str | None = None,
    urls: list[str] | None = None,
    skip_text_pages: bool = False,
    schedule: Schedule | None = None,
    submission_key: tuple[str, str] | None = None,
) -> Job:
    """Check every file (and the form of every URL), then store the job and its documents in
    one transaction. URLs are fetched later by a worker, never by the front.

    Nothing is left behind on a bad file: no rows, no files on disk.
    """
    pool = resolve_pool(pool_key)
    languages = resolve_languages(languages)
    schedule = schedule or Schedule()
    urls = [check_url(url) for url in (urls or []) if url.strip()]
    if not uploads and not urls:
        raise ApiError("no files: send at least one PDF or image, or a URL of one")
    if len(uploads) + len(urls) > settings.OCR_MAX_FILES_PER_JOB:
        count = len(uploads) + len(urls)
        raise ApiError(f"{count} documents; the limit is {settings.OCR_MAX_FILES_PER_JOB} per job", 413)
    staging = settings.MEDIA_ROOT / "staging" / uuid.uuid4().hex
    staging.mkdir(parents=True)
    job_dir: Path | None = None
    try:
        staged = [_stage(upload, staging, i) for i, upload in enumerate(uploads)]
        with transaction.atomic():
            job = Job.objects.create(owner=owner if owner and owner.is_authenticated else None, pool=pool,
                                     languages=languages, skip_text_pages=skip_text_pages,
                                     max_dollars=schedule.max_dollars, deadline=schedule.deadline,
                                     priority=schedule.priority)  # fmt: skip
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
            if submission_key is not None:
                key, fingerprint = submission_key
                SubmissionKey.objects.create(owner=job.owner, key=key, fingerprint=fingerprint, job=job)
            split_ids = list(job.documents.exclude(kind=Document.Kind.URL).values_list("pk", flat=True))
            fetch_ids = list(job.documents.filter(kind=Document.Kind.URL).values_list("pk", flat=True))
            transaction.on_commit(lambda: _enqueue_documents(split_ids, fetch_ids))
    except BaseException:
        if job_dir is not None:
            shutil.rmtree(job_dir, ignore_errors=True)
        raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    log.info("job %s submitted: %d documents, %d pages", job.pk, len(staged), sum(s.page_count for s in staged))
    return job


IDEMPOTENCY_KEY_RE = re.compile(r"[\x21-\x7e]{1,255}")


def submission_fingerprint(*, fields: dict, uploads: list[Upload]) -> str:
    """What makes two submissions the same: their fields and each file's name and bytes (the
    multipart boundary and the order of form fields do not count). Reads each file once and
    rewinds it."""
    digest = hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode())
    for upload in uploads:
        content = hashlib.sha256()
        while chunk := upload.file.read(CHUNK):
            content.update(chunk)
        upload.file.seek(0)
        digest.update(f"\0{upload.name}\0{content.hexdigest()}".encode())
    return digest.hexdigest()


def submission_key_job(*, owner, key: str, fingerprint: str) -> Job | None:
    """The job ``key`` made for ``owner`` within the last 24 hours, or None. The same key with
    another submission is refused (422). A key older than 24 hours is forgotten."""
    row = SubmissionKey.objects.select_related("job").filter(owner=owner, key=key).first()
    if row is None:
        return None
    if row.expired:
        SubmissionKey.objects.filter(pk=row.pk).delete()
        return None
    if row.fingerprint != fingerprint:
        raise ApiError(
            f"the Idempotency-Key {key[:60]!r} was used for a different submission (job {row.job_id}); "
            "send a new key for a new submission",
            422,
        )
    return row.job


def job_submit_once(*, owner, key: str, fields: dict, uploads: list[Upload], **submission) -> tuple[Job, bool]:
    """``job_submit`` under an ``Idempotency-Key``: (the job, whether this call made it).

    A retry of a submission whose answer was lost gets the first job back. Two requests racing
    on one key both pass the look-up; the unique constraint fails the second's insert, its
    whole submission rolls back (no rows, no files), and it answers with the first's job."""
    if not IDEMPOTENCY_KEY_RE.fullmatch(key):
        raise ApiError("the Idempotency-Key header must be 1 to 255 visible ASCII characters")
    fingerprint = submission_fingerprint(fields=fields, uploads=uploads)
    job = submission_key_job(owner=owner, key=key, fingerprint=fingerprint)
    if job is not None:
        return job, False
    try:
        return job_submit(owner=owner, uploads=uploads, submission_key=(key, fingerprint), **submission), True
    except IntegrityError:
        job = submission_key_job(owner=owner, key=key, fingerprint=fingerprint)
        if job is None:
            raise
        return job, False


def _enqueue_documents(split_ids: list[int], fetch_ids: list[int]) -> None:
    from ocrjobs.tasks import enqueue_fetch, enqueue_split  # ocrjobs.tasks imports the services

    for document_id in split_ids:
        enqueue_split(document_id)
    for document_id in fetch_ids:
        enqueue_fetch(document_id)


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
        raise ApiError("a URL is longer than 2,000 characters")
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise ApiError(f"{url[:100]}: only http and https URLs can be fetched")
    host = parts.hostname
    if not host:
        raise ApiError(f"{url[:100]}: the URL has no host")
    try:
        parts.port  # noqa: B018 (raises on a bad port)
    except ValueError:
        raise ApiError(f"{url[:100]}: the port is not a number") from None
    if settings.URL_FETCH_ALLOW_PRIVATE:
        return url
    if host == "localhost" or host.endswith((".localhost", ".local", ".internal")):
        raise ApiError(f"{url[:100]}: private and loopback addresses are refused")
    try:
        literal = ipaddress.ip_address(host)
    except ValueError:
        return url  # a name: resolved and checked by the worker that fetches it
    if not _address_allowed(str(literal)):
        raise ApiError(f"{url[:100]}: private and loopback addresses are refused")
    return url
