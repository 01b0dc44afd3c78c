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
import re
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from django.conf import settings
from django.core.files import File
from django.core.files.base import ContentFile
from django.core.files.storage import FileSystemStorage, Storage, storages

from fleetadmin.errors import DomainError
from ocrjobs.services import remote

CHUNK = 1024 * 1024

log = logging.getLogger(__name__)


class StorageError(Exception):
    """The documents' storage did not answer a read as it should: not within
    STORAGE_READ_TIMEOUT_SECONDS of waiting, more bytes than were asked for, or an error."""


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


def document_store(name: str, staged: Path, *, sync_folders: bool = True) -> str:
    """Put the staged file at ``staged`` into the documents' storage as ``name``, without reading
    it into memory; the name it was stored under (a backend may change it) is returned. The staged
    file is gone afterwards (moved, or uploaded and removed).

    Durable before it returns, as the job that names it will be once committed: on a filesystem
    the file's bytes are synced before the rename that names it and its folder after (a power
    loss after the answer would otherwise lose a document whose job survived); an S3 PUT is
    durable once answered. ``sync_folders=False``: the caller syncs the folders of all it stored
    at once (``document_folders_sync``), before the job that names them commits."""
    storage = documents()
    on_disk = isinstance(storage, FileSystemStorage)
    try:
        with open(staged, "rb") as f:
            if on_disk:
                os.fsync(f.fileno())
            stored = storage.save(name, _StagedFile(f, name=str(staged)))
        if on_disk and sync_folders:
            document_folders_sync([stored])
        return stored
    finally:
        staged.unlink(missing_ok=True)


def document_folders_sync(names: list[str]) -> None:
    """The entries made for stored documents ``names`` (each new file, the new folders that hold
    it: save makes them) made durable: each folder from theirs up to the storage's root synced
    once, however many of them it holds (a job's documents share all but their own)."""
    storage = documents()
    if not isinstance(storage, FileSystemStorage):
        return
    root = Path(storage.location)
    folders: dict[Path, None] = {}  # (in order: each document's own folder, then those above)
    for name in names:
        folder = Path(storage.path(name)).parent
        for path in (folder, *folder.parents):
            folders[path] = None
            if path == root or not path.is_relative_to(root):
                break
    for path in folders:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


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
    storage = documents()
    if not hasattr(storage, "bucket"):
        return storage.size(name)
    deadline = remote.Deadline(settings.STORAGE_READ_TIMEOUT_SECONDS)
    with _s3_exchange("HEAD", storage, name, deadline=deadline, max_bytes=0) as answer:
        length = answer.header("content-length")
        if answer.status != 200 or not length.isdigit():
            raise StorageError(f"the documents' storage answered {answer.status} to the size of {name}")
        return int(length)


def document_chunks(name: str, start: int = 0, end: int | None = None) -> Iterator[bytes]:
    """The stored file's bytes from ``start`` up to ``end`` (excluded; None: to its end), a chunk
    at a time and never the whole file in memory: the job page's viewer streams a document to the
    browser this way, and pdf.js asks for ranges of a long PDF."""
    storage = documents()
    if hasattr(storage, "bucket"):
        yield from _s3_chunks(storage, name, start, end)
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


@contextlib.contextmanager
def _s3_exchange(method: str, storage, name: str, *, deadline: remote.Deadline, max_bytes: int,
                 headers: dict[str, str] | None = None) -> Iterator[remote.Answer]:  # fmt: skip
    """One request for the object ``name`` through a presigned URL, with the total deadline and
    the size cap of an exchange with any other machine (ocrjobs/services/remote.py: enforced
    outside httpx's read loop, which limits each read, not their sum); its failures, the body's
    included, as StorageError. boto3 has per-read timeouts only, and retries them."""
    operation = {"GET": "get_object", "HEAD": "head_object"}[method]
    url = storage.bucket.meta.client.generate_presigned_url(
        operation, Params={"Bucket": storage.bucket.name, "Key": _s3_key(storage, name)}, ExpiresIn=300
    )
    try:
        with remote.exchange(method, url, deadline=deadline, max_bytes=max_bytes, headers=headers,
                             any_address=True) as answer:  # fmt: skip
            yield answer
    except DomainError as exc:
        raise StorageError(f"the documents' storage, reading {name}: {exc.message}") from None


def _s3_chunks(storage, name: str, start: int, end: int | None) -> Iterator[bytes]:
    """The object's bytes from ``start`` to ``end``, CHUNK at a time, never more than asked for (a
    whole object: never more than a document may be). A GET through a presigned URL: boto3 checks
    the whole object's checksum against a ranged body when a server sends it (rclone serve s3
    does), and no call turns that off. The deadline counts the waits on the storage server only:
    its clock stops while the consumer holds a chunk (a slow browser's time is the front's
    concern, fleetadmin/front.py)."""
    ranged = bool(start) or end is not None
    asked = settings.OCR_MAX_FILE_BYTES if end is None else max(0, end - start)
    headers = {"Range": f"bytes={start}-{'' if end is None else end - 1}"} if ranged else None
    deadline = remote.Deadline(settings.STORAGE_READ_TIMEOUT_SECONDS)
    with _s3_exchange("GET", storage, name, deadline=deadline, max_bytes=asked, headers=headers) as answer:
        # Where the body starts: its Content-Range says (rclone serve s3 sends one with a 200); a
        # server that ignores the range sends none, and the object from its first byte.
        first = re.match(r"bytes (\d+)-", answer.header("content-range"))
        if answer.status not in (200, 206) or (int(first.group(1)) if first else 0) != start:
            shown = answer.header("content-range") or "no Content-Range"
            raise StorageError(
                f"the documents' storage answered {answer.status} ({shown}) to a read of {name} from {start}"
            )
        for chunk in _rechunked(answer.chunks, CHUNK):
            held = time.monotonic()
            yield chunk
            deadline.extend(time.monotonic() - held)


def _rechunked(parts: Iterator[bytes], size: int) -> Iterator[bytes]:
    """The bytes of ``parts`` in pieces of ``size`` (the last shorter)."""
    buffer = bytearray()
    for part in parts:
        buffer += part
        while len(buffer) >= size:
            yield bytes(buffer[:size])
            del buffer[:size]
    if buffer:
        yield bytes(buffer)


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
