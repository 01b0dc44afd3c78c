"""Where documents' bytes live: Django's storage API (``STORAGES["documents"]``), so that any
front or worker host reads what another stored (DESIGN invariant 16).

The embedded default is a FileSystemStorage under MEDIA_ROOT; a deployment of several hosts
sets ``STORAGE_S3_BUCKET`` (S3-compatible object storage through django-storages and boto3,
fleetadmin/settings.py). Every reader and writer of a document's bytes goes through this
module: submission and fetch (``document_store``), the split (``document_local``), the
dispatcher (``document_file``, ``document_bytes``). Page results live in the database
(ocrjobs/services/pages.py).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import httpx
from django.conf import settings
from django.core.files import File
from django.core.files.base import ContentFile
from django.core.files.storage import Storage, storages

CHUNK = 1024 * 1024

log = logging.getLogger(__name__)


def documents() -> Storage:
    return storages["documents"]


class _StagedFile(File):
    """A staged local file that FileSystemStorage moves into place (a rename on the same
    filesystem) instead of copying; other backends stream it (S3: a multipart upload)."""

    def temporary_file_path(self) -> str:
        return self.name


def _s3_key(storage, name: str) -> str:
    """The object key S3Storage gives ``name`` (its location prefix, the name cleaned)."""
    from storages.utils import clean_name  # boto3 is imported only where S3 is configured

    return storage._normalize_name(clean_name(name))


def document_store(name: str, staged: Path) -> str:
    """Put the staged file at ``staged`` into the documents' storage as ``name``, without reading
    it into memory; the name it was stored under (a backend may change it) is returned. The staged
    file is gone afterwards (moved, or uploaded and removed)."""
    storage = documents()
    try:
        with open(staged, "rb") as f:
            return storage.save(name, _StagedFile(f, name=str(staged)))
    finally:
        staged.unlink(missing_ok=True)


def document_save_bytes(name: str, data: bytes) -> str:
    """Store bytes made here (a page image the split rendered); the name they were stored under."""
    return documents().save(name, ContentFile(data))


def document_bytes(name: str) -> bytes:
    """The whole stored file (a dispatcher sends it to a pod as it is)."""
    storage = documents()
    if hasattr(storage, "bucket"):  # S3Storage
        # One GET. storage.open() asks with a HEAD first and spools the body to a temporary file:
        # 6.4-7.4 ms of client CPU per 150 kB read, 2.9-3.1 ms this way (bench/storage.py).
        return storage.bucket.Object(_s3_key(storage, name)).get()["Body"].read()
    with storage.open(name, "rb") as f:
        return f.read()


def document_size(name: str) -> int:
    return documents().size(name)


def document_chunks(name: str, start: int = 0, end: int | None = None) -> Iterator[bytes]:
    """The stored file's bytes from ``start`` up to ``end`` (excluded; None: to its end), a chunk
    at a time and never the whole file in memory: the job page's viewer streams a document to the
    browser this way, and pdf.js asks for ranges of a long PDF."""
    storage = documents()
    if hasattr(storage, "bucket") and not start and end is None:  # S3: the body as it arrives
        body = storage.bucket.Object(_s3_key(storage, name)).get()["Body"]  # (open() spools it whole first)
        try:
            yield from body.iter_chunks(CHUNK)
        finally:
            body.close()
        return
    if hasattr(storage, "bucket"):
        # A range through a presigned URL: boto3 checks the whole object's checksum against a
        # ranged body when a server sends it (rclone serve s3 does), and no call turns that off.
        client = storage.bucket.meta.client
        url = client.generate_presigned_url(
            "get_object", Params={"Bucket": storage.bucket.name, "Key": _s3_key(storage, name)}, ExpiresIn=300
        )
        last = "" if end is None else end - 1
        with httpx.stream("GET", url, headers={"Range": f"bytes={start}-{last}"}, timeout=30) as answer:
            answer.raise_for_status()
            yield from answer.iter_bytes(CHUNK)
        return
    with storage.open(name, "rb") as f:
        f.seek(start)
        left = None if end is None else end - start
        while left is None or left > 0:
            block = f.read(CHUNK if left is None else min(CHUNK, left))
            if not block:
                return
            if left is not None:
                left -= len(block)
            yield block


def document_file(name: str) -> BinaryIO | None:
    """The stored file opened for reading when it is on this host's filesystem (a dispatcher has
    the kernel send it to a pod: sendfile), else None (object storage: ``document_bytes``)."""
    try:
        path = documents().path(name)
    except NotImplementedError:
        return None
    return open(path, "rb")


@contextlib.contextmanager
def document_local(name: str) -> Iterator[Path]:
    """A local path to the stored file for readers that want one (pypdfium2, Pillow): the file
    itself on the local filesystem, else a temporary copy downloaded in chunks, removed after."""
    storage = documents()
    try:
        local = Path(storage.path(name))
    except NotImplementedError:  # object storage: no local path
        local = None
    if local is not None:
        yield local
        return
    fd, temporary = tempfile.mkstemp(prefix="fleetadmin-document-")
    try:
        with os.fdopen(fd, "wb") as out:
            if hasattr(storage, "bucket"):  # S3: straight into the file (open() spools it first)
                storage.bucket.Object(_s3_key(storage, name)).download_fileobj(out)
            else:
                with storage.open(name, "rb") as src:
                    shutil.copyfileobj(src, out, CHUNK)
        yield Path(temporary)
    finally:
        Path(temporary).unlink(missing_ok=True)


def document_delete(name: str) -> None:
    if name:
        documents().delete(name)


STAGING_MAX_AGE_SECONDS = 24 * 3600


def staging_prune() -> int:
    """Remove staging directories (uploads checked before their job is stored) left by a front
    that died mid-request: any untouched for a day. The number removed."""
    staging = settings.MEDIA_ROOT / "staging"
    if not staging.is_dir():
        return 0
    cutoff = time.time() - STAGING_MAX_AGE_SECONDS
    removed = 0
    for entry in staging.iterdir():
        try:
            if entry.is_dir() and entry.stat().st_mtime < cutoff:
                shutil.rmtree(entry, ignore_errors=True)
                removed += 1
        except FileNotFoundError:
            continue  # (its own request removed it meanwhile)
    if removed:
        log.warning("removed %d staging directories older than a day (a front died mid-upload)", removed)
    return removed
