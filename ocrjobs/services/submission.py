"""Submission, in the front: every upload is sniffed and checked against the limits (size,
pages, pixels), URLs only for their form; then each document is stored and the job and its
documents are stored in one transaction. The front only reads the uploaded files: it never
resolves or fetches a URL. Each upload is staged to a local file (moved there when Django spooled
it already), checked, then moved or sent to the documents' storage.

Length: the checks of a document (sniffing, pages, pixels a page and a document: the front, the
fetch and the split share them) stay beside the submission that is their first caller; split
out, they would be a module that imports this one's staging and limits back.
"""

from __future__ import annotations

import hashlib
import io
import logging
import re
import shutil
import threading
import unicodedata
import urllib.parse
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import pypdfium2 as pdfium
import pypdfium2.raw as pdfium_c
from django.conf import settings
from django.core.files.move import file_move_safe
from django.db import transaction
from django.utils import timezone
from PIL import Image, JpegImagePlugin, PngImagePlugin, TiffImagePlugin

from fleetadmin import leases
from fleetadmin.errors import (
    Conflict,
    DomainError,
    Forbidden,
    Invalid,
    NotFound,
    TooLarge,
    Unprocessable,
    UnsupportedType,
)
from ocrjobs.enqueue import enqueue_splits
from ocrjobs.models import Document, Job, SubmissionKey
from ocrjobs.services import fetch_turns
from ocrjobs.services.budgets import schedule_within_budget
from ocrjobs.services.schedule import Schedule
from ocrjobs.services.urls import check_url
from ocrjobs.storage import document_delete, document_folders_sync, document_store
from pods.models import Pool
from pods.services.forecast import forecast_choice, job_forecast

log = logging.getLogger(__name__)

CHUNK = 1024 * 1024
LANGUAGE_RE = re.compile(r"^[a-z][a-z_]{1,30}(\+[a-z][a-z_]{1,30})*$")


@dataclass
class Upload:
    name: str
    file: IO[bytes]


@dataclass
class Staged:
    name: str
    path: Path  # the staged local file
    size: int
    kind: str
    suffix: str
    page_count: int
    sha256: str


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


def open_image(source: Path | IO[bytes]) -> Image.Image:
    """The image at ``source`` (a path or a binary file), opened (its header read) without
    Pillow's size check: the caller checks the size against OCR_MAX_IMAGE_PIXELS (``_check_pixels``)."""
    if isinstance(source, Path):
        with open(source, "rb") as f:
            sniffed = _sniff(f.read(8))
    else:
        source.seek(0)
        sniffed = _sniff(source.read(8))
        source.seek(0)
    reader = _READERS.get(sniffed[1]) if sniffed else None
    if reader is not None:
        try:
            return reader(source)
        except Exception:
            if not isinstance(source, Path):
                source.seek(0)
            # Image.open tries every reader, and says what is wrong as it always has
    return Image.open(source)


def stage_upload(upload: Upload, directory: Path, index: int) -> Staged:
    name = clean_filename(upload.name)
    path = directory / f"{index}"
    size = 0
    limit = settings.OCR_MAX_FILE_BYTES
    # Hashed as the bytes stream in: the name the pods cache the document under.
    digest = hashlib.sha256()
    sha256 = None
    spooled = getattr(upload.file, "temporary_file_path", None)
    if spooled is not None and getattr(upload.file, "size", limit + 1) <= limit:
        # Django spooled the upload to a file of its own already, and hashed it on the way
        # (ocrjobs.uploads): moved rather than written again (a fifth of the front's CPU on large
        # uploads), read only if it was not hashed.
        sha256 = getattr(upload.file, "sha256", None)
        size = upload.file.size
        if sha256 is None:
            upload.file.seek(0)
            while chunk := upload.file.read(CHUNK):
                digest.update(chunk)
        file_move_safe(spooled(), path, allow_overwrite=True)
    else:
        with open(path, "wb") as out:
            while chunk := upload.file.read(CHUNK):
                size += len(chunk)
                if size > limit:
                    raise TooLarge(f"{name}: the file is larger than the limit of {limit} bytes")
                digest.update(chunk)
                out.write(chunk)
    with open(path, "rb") as f:
        kind, suffix, pages = _checked(name, size, f)
    return Staged(name=name, path=path, size=size, kind=kind, suffix=suffix, page_count=pages,
                   sha256=sha256 or digest.hexdigest())  # fmt: skip


def _checked(name: str, size: int, file: IO[bytes]) -> tuple[str, str, int]:
    """(kind, file name suffix, page count) of a document that passes the checks; a DomainError if not."""
    if size == 0:
        raise Invalid(f"{name}: the file is empty")
    sniffed = _sniff(file.read(8))
    if sniffed is None:
        raise UnsupportedType(f"{name}: not a PDF, PNG, JPEG or TIFF file")
    kind, suffix = sniffed
    return kind, suffix, document_pages(name, kind, file)


def document_pages(name: str, kind: str, file: IO[bytes]) -> int:
    """A document's page count, once it passes the limits: pages per document, pixels per page
    (a PDF page's at the render DPI, from its size: nothing is rendered), no encryption. A DomainError
    says what is wrong. Checked by the front as a document arrives, and by the split."""
    pages = _count_pdf_pages(name, file) if kind == Document.Kind.PDF else _count_image_frames(name, file)
    if pages == 0:
        raise Invalid(f"{name}: the document has no pages")
    if pages > settings.OCR_MAX_PAGES_PER_DOCUMENT:
        raise TooLarge(
            f"{name}: {pages} pages; the limit is {settings.OCR_MAX_PAGES_PER_DOCUMENT} pages per document",
        )
    return pages


# PDFium is not thread-safe: no two of its calls may run at once in a process, not even on
# different documents (pypdfium2's documentation, "Incompatibility with Threading"). The front
# checks uploads on a thread per request, so every use of it here and in the split holds this.
PDFIUM_LOCK = threading.RLock()


def pdf_input(file: IO[bytes]) -> str | IO[bytes]:
    """What PDFium opens: a local file by its path (read natively), else the file itself."""
    if isinstance(file, io.BufferedReader) and isinstance(getattr(file, "name", None), str):
        return file.name
    file.seek(0)
    return file


def _count_pdf_pages(name: str, file: IO[bytes]) -> int:
    with PDFIUM_LOCK:
        try:
            pdf = pdfium.PdfDocument(pdf_input(file))
        except pdfium.PdfiumError as exc:
            error = exc
        else:
            try:
                return _checked_pdf_pages(name, pdf)
            finally:
                pdf.close()
    if "password" in str(error).lower():
        # PDFium also answers "incorrect password" for a PDF with no pages;
        # only a file with an encryption dictionary is really encrypted.
        if _has_encrypt_entry(file):
            raise Invalid(f"{name}: the PDF is encrypted; remove its password and submit it again") from None
        raise Invalid(f"{name}: the document has no pages") from None
    raise Invalid(f"{name}: the PDF is corrupt and cannot be read ({error})") from None


def _checked_pdf_pages(name: str, pdf: pdfium.PdfDocument) -> int:
    """The PDF's page count, once it is one we can read. A page too large to render at the DPI
    asked for is no refusal: the pod renders it at the largest DPI under its pixel limit, with a
    warning (podserver/pages.py, ``fitting_dpi``); nothing is rendered here. The document's pixels
    are summed over its pages (each at most what the pod renders of it)."""
    if pdf.get_formtype() == pdfium_c.FORMTYPE_XFA_FULL:
        # A dynamic XFA form's pages are made by the form's software as it opens; the PDF's own
        # pages hold only a placeholder ("Please wait..."), read as nothing.
        raise Unprocessable(
            f"{name}: a dynamic XFA form: its pages are drawn by the form software (Adobe Reader) when it "
            "opens, and the PDF holds no page to read; print it to a PDF, or flatten it, and submit that",
        )
    pages = len(pdf)
    if pages > settings.OCR_MAX_PAGES_PER_DOCUMENT:
        return pages  # refused for its page count; no need to measure every page
    scale = settings.OCR_RENDER_DPI / 72
    total = 0
    for index in range(pages):
        width, height = pdf.get_page_size(index)
        total += min(int(width * scale) * int(height * scale), settings.OCR_MAX_IMAGE_PIXELS)
    _check_document_pixels(name, total, pages, "pages would render at")
    return pages


def _has_encrypt_entry(file: IO[bytes]) -> bool:
    """Whether the file names an encryption dictionary (its trailer or xref stream has /Encrypt)."""
    needle = b"/Encrypt"
    tail = b""
    file.seek(0)
    while chunk := file.read(CHUNK):
        if needle in tail + chunk:
            return True
        tail = chunk[-len(needle) :]
    return False


def _check_pixels(name: str, image: Image.Image) -> None:
    width, height = image.size
    if width * height > settings.OCR_MAX_IMAGE_PIXELS:
        raise TooLarge(
            f"{name}: {width}×{height} pixels is over the limit of {settings.OCR_MAX_IMAGE_PIXELS} pixels",
        )


def _check_document_pixels(name: str, total: int, pages: int, what: str) -> None:
    """Pixels summed over a document's pages or frames (review N2: 3,000 blank 100-megapixel
    frames are 10 MB of Group 4 TIFF and hours of drawing) against OCR_MAX_DOCUMENT_PIXELS."""
    if total > settings.OCR_MAX_DOCUMENT_PIXELS:
        raise TooLarge(
            f"{name}: its {pages} {what} {total:,} pixels in all, over the limit of "
            f"{settings.OCR_MAX_DOCUMENT_PIXELS:,} pixels a document",
        )


def _count_image_frames(name: str, file: IO[bytes]) -> int:
    try:
        with open_image(file) as image:
            _check_pixels(name, image)
            frames = getattr(image, "n_frames", 1)
            total = image.size[0] * image.size[1]
            image.verify()
        if frames > 1:
            with open_image(file) as image:
                if image.format == "TIFF":
                    # Each TIFF frame has its own size: a small first frame
                    # must not let a huge second one through. Seeking reads
                    # only the frame's header.
                    for frame in range(1, frames):
                        image.seek(frame)
                        _check_pixels(name, image)
                        total += image.size[0] * image.size[1]
                else:  # frames of one size
                    total *= frames
        _check_document_pixels(name, total, frames, "frames are")
    except DomainError:
        raise
    except Exception as exc:  # Pillow raises many types for a broken file
        raise Invalid(f"{name}: the image is corrupt and cannot be read ({exc})") from None
    return frames


def resolve_pool(key: str | None, owner=None) -> Pool:
    """The pool asked for (by default the first one open to ``owner``), if it is open to them
    (``Pool.objects.open_to``: staff-only pools and pools kept to groups)."""
    open_pools = Pool.objects.open_to(owner)
    if not key:
        pool = open_pools.order_by("pk").first()
        if pool is None:
            if Pool.objects.exists():
                raise Forbidden("no pool is open to you: ask an administrator")
            raise Conflict("no pool is configured")
        return pool
    pool = Pool.objects.filter(key=key).first()
    if pool is None:
        raise NotFound(f"unknown pool {key!r}")
    if not open_pools.filter(pk=pool.pk).exists():
        raise Forbidden(f"pool {key!r} is not open to you")
    return pool


def resolve_languages(value: str | None) -> str:
    """The language list, checked strictly (API, form and CLI alike): None means ``eng``; anything
    else must be codes joined by ``+`` and each one installed. Never trimmed into something else."""
    value = "eng" if value is None else value.strip()
    if not LANGUAGE_RE.fullmatch(value):
        raise Invalid(f"languages must look like 'eng' or 'eng+deu', not {value!r}", field="languages")
    unknown = [lang for lang in value.split("+") if lang not in settings.OCR_LANGUAGES]
    if unknown:
        available = ", ".join(settings.OCR_LANGUAGES)
        raise Invalid(f"language {unknown[0]!r} is not available (available: {available})", field="languages")
    return value


def job_submit(
    *,
    owner,
    uploads: list[Upload],
    pool_key: str | None = None,
    languages: str | None = None,
    urls: list[str] | None = None,
    text_mode: str = Job.TextMode.REDO,
    skip_text_pages: bool = False,
    searchable_pdf: bool = False,
    schedule: Schedule | None = None,
    submission_key: tuple[str, str] | None = None,
    dry_run: bool = False,
    callback_url: str = "",
    labels: list[str] | None = None,
) -> Job | dict:
    """Check every file (and the form of every URL), then store the job and its documents in
    one transaction. URLs are fetched later by a worker, never by the front.

    Nothing is left behind on a bad file: no rows, no stored files. ``dry_run``: the same
    checks, then the forecast (pods/services/forecast.py) instead of a job; nothing is stored.
    ``skip_text_pages``: ``text_mode`` skip, by its older name.
    """
    pool, languages, schedule, urls = _checked_request(
        owner=owner, uploads=uploads, pool_key=pool_key, languages=languages, urls=urls, text_mode=text_mode,
        schedule=schedule,
    )  # fmt: skip
    staging = settings.MEDIA_ROOT / "staging" / uuid.uuid4().hex if uploads else None
    stored: list[str] = []
    try:
        staged = _staged_uploads(uploads, staging)
        forecast = _forecast(staged, urls, pool if pool_key else None, owner, schedule)
        if not pool_key:
            pool = Pool.objects.get(key=forecast["chosen"]["pool"])
        if dry_run:
            return forecast
        # Stored before the transaction: an upload to object storage takes a while, and no
        # transaction (on SQLite: the database's one writer) waits for it.
        for item in staged:
            name = f"documents/{uuid.uuid4().hex}/source{item.suffix}"
            stored.append(document_store(name, item.path, sync_folders=False))
        document_folders_sync(stored)  # (the folders they share synced once, not once a document)
        job = Job(owner=owner if owner and owner.is_authenticated else None, pool=pool, languages=languages,
                  text_mode=Job.TextMode.SKIP if skip_text_pages else text_mode, searchable_pdf=searchable_pdf,
                  forecast=forecast, callback_url=callback_url, labels=Job.labels_stored(labels or []))  # fmt: skip
        _job_store(job, owner=owner, schedule=schedule, staged=staged, stored=stored, urls=urls,
                   submission_key=submission_key)  # fmt: skip
    except BaseException:
        for name in stored:
            document_delete(name)
        raise
    finally:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
    log.info("job %s submitted: %d documents, %d pages", job.pk, len(staged), sum(s.page_count for s in staged))
    return job


def _checked_request(
    *, owner, uploads: list[Upload], pool_key: str | None, languages: str | None, urls: list[str] | None,
    text_mode: str, schedule: Schedule | None,
) -> tuple[Pool, str, Schedule, list[str]]:  # fmt: skip
    """What a submission asks, checked before any file is read: (the pool named, or the first
    one open to the owner until the forecast chooses; the languages; the schedule within the
    owner's budget; the URLs, each in a form we fetch)."""
    if text_mode not in Job.TextMode.values:
        raise Invalid(f"text_mode takes {', '.join(Job.TextMode.values)}, not {text_mode!r}", field="text_mode")
    pool = resolve_pool(pool_key, owner)
    languages = resolve_languages(languages)
    schedule = schedule_within_budget(owner, schedule or Schedule())
    urls = [check_url(url) for url in (urls or []) if url.strip()]
    if not uploads and not urls:
        raise Invalid("no files: send at least one PDF or image, or a URL of one")
    if len(uploads) + len(urls) > settings.OCR_MAX_FILES_PER_JOB:
        count = len(uploads) + len(urls)
        raise TooLarge(f"{count} documents; the limit is {settings.OCR_MAX_FILES_PER_JOB} per job")
    return pool, languages, schedule, urls


def _staged_uploads(uploads: list[Upload], staging: Path | None) -> list[Staged]:
    """Every upload staged in ``staging`` (made here) and checked, in order; the first that
    fails the checks refuses the submission."""
    if staging is not None:
        staging.mkdir(parents=True)
    return [stage_upload(upload, staging, i) for i, upload in enumerate(uploads)]


def _job_store(
    job: Job, *, owner, schedule: Schedule, staged: list[Staged], stored: list[str], urls: list[str],
    submission_key: tuple[str, str] | None,
) -> None:  # fmt: skip
    """Store ``job`` (not saved yet) and its documents in one transaction, with its key; its
    splits and fetches start once it is committed. ``job.submitted_documents``: the documents."""
    with transaction.atomic():
        schedule = schedule_within_budget(owner, schedule, lock=True)  # (again, in turn with their others)
        job.max_dollars, job.deadline, job.priority = schedule.max_dollars, schedule.deadline, schedule.priority
        job.save(force_insert=True)
        documents = []
        for position, (item, source) in enumerate(zip(staged, stored, strict=True)):
            documents.append(Document(job=job, position=position, name=item.name, kind=item.kind, source=source,
                                      size_bytes=item.size, page_count=item.page_count, sha256=item.sha256,
                                      **leases.queued()))  # fmt: skip
        for offset, url in enumerate(urls):
            documents.append(Document(job=job, position=len(staged) + offset, name=name_from_url(url),
                                      kind=Document.Kind.URL, url=url, source="", size_bytes=0, page_count=0,
                                      **fetch_turns.waiting()))  # fmt: skip
        Document.objects.bulk_create(documents)  # their ids set (SQLite and PostgreSQL return them)
        if submission_key is not None:
            key, fingerprint = submission_key
            SubmissionKey.objects.create(owner=job.owner, key=key, fingerprint=fingerprint, job=job)
        split_ids = [d.pk for d in documents if d.kind != Document.Kind.URL]
        transaction.on_commit(lambda: enqueue_splits(split_ids))
        if urls:  # their fetches wait for a slot, in turn by owner
            transaction.on_commit(fetch_turns.fetches_start)
        job.submitted_documents = documents


def _forecast(staged: list[Staged], urls: list[str], pool: Pool | None, owner, schedule: Schedule) -> dict:
    """The forecast of every pool open to the owner, with the pool and sizing the job takes
    (``chosen``): ``pool`` if named, else the cheapest that meets the forecast (forecast_choice),
    first in its list (what the job's page reads as its own)."""
    pages = sum(item.page_count for item in staged)
    forecast = job_forecast(pages=pages, urls=len(urls), pool=pool, pools=Pool.objects.open_to(owner))
    minutes_left = None
    if schedule.deadline is not None:
        minutes_left = (schedule.deadline - timezone.now()).total_seconds() / 60
    among = forecast if pool is None else {"pools": [p for p in forecast["pools"] if p["pool"] == pool.key]}
    key, sizing = forecast_choice(among, priority=schedule.priority, minutes_left=minutes_left)
    forecast["pools"].sort(key=lambda p: p["pool"] != key)
    forecast["chosen"] = {"pool": key, "sizing": sizing, "by": "named" if pool is not None else "cheapest"}
    return forecast


def name_from_url(url: str) -> str:
    path = urllib.parse.urlsplit(url).path
    return clean_filename(urllib.parse.unquote(path.rsplit("/", 1)[-1])) if path.strip("/") else "document"
