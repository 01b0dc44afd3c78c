"""Where documents' bytes live: Django's storage API (``STORAGES["documents"]``), so that any
front or worker host reads what another stored (DESIGN invariant 16).

The embedded default is a FileSystemStorage under MEDIA_ROOT; a deployment of several hosts
sets ``STORAGE_S3_BUCKET`` (S3-compatible object storage through django-storages and boto3,
fleetadmin/settings.py). Every reader and writer of a document's bytes goes through this
module: submission and fetch (``document_store``), the split (``document_local``), the
dispatcher (``document_file``, ``document_bytes``). Page results live in the database
(ocrjobs/services/pages.py).

An upload the front holds in memory is written once, straight to its name
(``document_store_memory``): no temporary file, no move, and past the page cache (O_DIRECT) where
the filesystem allows it. The front never reads a document again and a worker reads it once or
twice, so caching its pages buys little; filling the cache with them cost the front more than
anything else it does (bench/ingest.py: 785 MB of uploads, 0.6-1.5 CPU-s written through the
cache, 0.14-0.16 s written past it; the worker's sendfile of them 0.09-0.11 s against 0.13 s).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import mmap
import os
import shutil
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from django.core.files import File
from django.core.files.base import ContentFile
from django.core.files.storage import FileSystemStorage, Storage, storages

from fleetadmin.bodies import MemoryReader

CHUNK = 1024 * 1024
DIRECT_ALIGN = 4096  # of a direct write's memory, offset and length: any block size up to a page
DIRECT_MIN_BYTES = 64 * 1024  # smaller files go through the page cache: one write, no copy

_direct_buffers = threading.local()  # each writing thread's aligned CHUNK, reused


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


def document_store_memory(name: str, data: memoryview) -> str:
    """Store bytes the front holds in memory (an upload's bytes where they lie in the request body)
    as ``name``; the name they were stored under. On the local filesystem they are written once,
    straight to the file ``name`` (FileSystemStorage would copy them 64 KiB at a time); elsewhere
    they go through the storage API, read from memory as they are sent. A write that fails leaves
    no file behind."""
    storage = documents()
    if type(storage) is not FileSystemStorage or storage.directory_permissions_mode is not None:
        return storage.save(name, File(MemoryReader(data), name=name))
    path = storage.path(storage.generate_filename(name))  # checked as save() checks it: inside the root
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # a name is never reused
    try:
        _write_new_file(fd, data)
        if storage.file_permissions_mode is not None:
            os.fchmod(fd, storage.file_permissions_mode)
        root_group = os.stat(storage.location).st_gid  # as FileSystemStorage leaves a file: the root's group
        if os.fstat(fd).st_gid != root_group:
            with contextlib.suppress(PermissionError):
                os.fchown(fd, -1, root_group)
    except BaseException:
        os.close(fd)
        os.unlink(path)
        raise
    os.close(fd)
    return name


def _write_new_file(fd: int, data: memoryview) -> None:
    """Write ``data`` into the new, empty file ``fd``: its whole pages past the page cache where the
    filesystem allows it (``_write_direct``), the rest through the cache."""
    written = 0
    if len(data) >= DIRECT_MIN_BYTES:
        written = _write_direct(fd, data[: len(data) - len(data) % DIRECT_ALIGN])
    while written < len(data):
        written += os.write(fd, data[written:])


def _write_direct(fd: int, data: memoryview) -> int:
    """Write ``data`` (whole pages) from the start of ``fd`` with O_DIRECT, copied a CHUNK at a time
    into an aligned buffer (O_DIRECT wants aligned memory, offsets and lengths); how many bytes were
    written, 0 if the filesystem refuses direct writes, fewer if it refuses them midway."""
    flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    try:
        fcntl.fcntl(fd, fcntl.F_SETFL, flags | os.O_DIRECT)
    except OSError:
        return 0
    written = 0
    try:
        with memoryview(_direct_buffer()) as buffer:
            while written < len(data) and written % DIRECT_ALIGN == 0:
                length = min(CHUNK, len(data) - written)
                buffer[:length] = data[written : written + length]
                written += os.write(fd, buffer[:length])
    except OSError as exc:
        if exc.errno != errno.EINVAL:  # EINVAL: this file refuses direct writes after all
            raise
    finally:
        fcntl.fcntl(fd, fcntl.F_SETFL, flags)
    return written


def _direct_buffer() -> mmap.mmap:
    buffer = getattr(_direct_buffers, "buffer", None)
    if buffer is None:
        buffer = _direct_buffers.buffer = mmap.mmap(-1, CHUNK)  # page-aligned, as anonymous maps are
    return buffer


def document_save_bytes(name: str, data: bytes) -> str:
    """Store bytes made here (a page image the split rendered); the name they were stored under."""
    return documents().save(name, ContentFile(data))


def document_bytes(name: str) -> bytes:
    """The whole stored file (a dispatcher sends it to a pod as it is)."""
    storage = documents()
    if hasattr(storage, "bucket"):  # S3Storage
        # One GET. storage.open() asks with a HEAD first and spools the body to a temporary file:
        # 6.4-7.4 ms of client CPU per 150 kB read, 2.9-3.1 ms this way (rclone serve s3 on this machine).
        return storage.bucket.Object(_s3_key(storage, name)).get()["Body"].read()
    with storage.open(name, "rb") as f:
        return f.read()


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
