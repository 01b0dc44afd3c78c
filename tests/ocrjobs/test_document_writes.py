"""An upload the front holds in memory, written to the local documents' storage
(ocrjobs.storage.document_store_memory): byte for byte whatever its length and wherever it lies in
its request body, its whole pages past the page cache (O_DIRECT), and through the cache on a
filesystem that refuses direct writes; and read back into the cache off the dispatcher's loop
before the loop sends it (ocrjobs.dispatch.documents.document_body)."""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import fcntl
import mmap
import os
from pathlib import Path

import pytest

from ocrjobs import storage
from ocrjobs.dispatch.documents import document_body
from ocrjobs.storage import DIRECT_ALIGN, DIRECT_MIN_BYTES, document_store_memory

SIZES = [1, DIRECT_ALIGN - 1, DIRECT_MIN_BYTES - 1, DIRECT_MIN_BYTES, DIRECT_MIN_BYTES + 1,
         storage.CHUNK, 3 * storage.CHUNK + DIRECT_ALIGN + 123]  # fmt: skip


def held_in_a_body(data: bytes, offset: int) -> memoryview:
    """``data`` where an upload's bytes lie: ``offset`` bytes into a larger body (never aligned)."""
    body = bytearray(os.urandom(offset)) + data + b"\r\n--boundary--\r\n"
    return memoryview(body)[offset : offset + len(data)]


def resident_pages(path: Path) -> int:
    """How many of the file's pages the page cache holds: mincore(2) over a private map of it
    (mapping faults nothing in; ACCESS_COPY lends ctypes a buffer and never changes the file)."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    size = path.stat().st_size
    pages = (ctypes.c_ubyte * -(-size // mmap.PAGESIZE))()
    with open(path, "rb") as f, mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY) as mapped:
        start = ctypes.c_char.from_buffer(mapped)
        failed = libc.mincore(ctypes.byref(start), ctypes.c_size_t(size), pages)
        del start
    if failed:
        raise OSError(ctypes.get_errno(), "mincore")
    return sum(page & 1 for page in pages)


def filesystem_type(path: Path) -> str:
    best = ("", "")
    for line in Path("/proc/self/mounts").read_text().splitlines():
        _, mount_point, kind, *_ = line.split()
        if str(path).startswith(mount_point.rstrip("/") + "/") and len(mount_point) > len(best[0]):
            best = (mount_point, kind)
    return best[1]


@pytest.mark.parametrize("size", SIZES)
def test_an_upload_is_stored_byte_for_byte_whatever_its_length(media_root, size):
    data = os.urandom(size)

    name = document_store_memory("documents/a/source.pdf", held_in_a_body(data, offset=1 + size % 511))

    assert name == "documents/a/source.pdf"
    assert (media_root / name).read_bytes() == data


def test_an_upload_is_written_past_the_page_cache(media_root):
    if filesystem_type(media_root) == "tmpfs":
        pytest.skip("a tmpfs file lives in the page cache")
    data = os.urandom(3 * storage.CHUNK + DIRECT_ALIGN + 123)

    name = document_store_memory("documents/b/source.pdf", held_in_a_body(data, offset=7))

    assert resident_pages(media_root / name) <= 1  # the last, partial page goes through the cache
    assert (media_root / name).read_bytes() == data
    assert resident_pages(media_root / name) == -(-len(data) // mmap.PAGESIZE)  # the check can see a cached page


def test_a_filesystem_that_refuses_direct_writes_gets_the_bytes_through_the_cache(media_root, monkeypatch):
    real_fcntl = fcntl.fcntl

    def refusing(fd, command, argument=0):
        if command == fcntl.F_SETFL and argument & os.O_DIRECT:
            raise OSError(errno.EINVAL, "direct writes refused")
        return real_fcntl(fd, command, argument)

    monkeypatch.setattr(storage.fcntl, "fcntl", refusing)
    data = os.urandom(storage.CHUNK + 5)

    name = document_store_memory("documents/c/source.pdf", held_in_a_body(data, offset=3))

    assert (media_root / name).read_bytes() == data


def test_a_file_that_refuses_a_direct_write_midway_gets_the_rest_through_the_cache(media_root, monkeypatch):
    real_write = os.write
    direct_writes = []

    def refusing_the_second(fd, data):
        if real_fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT:
            direct_writes.append(len(data))
            if len(direct_writes) == 2:
                raise OSError(errno.EINVAL, "this file refuses direct writes")
        return real_write(fd, data)

    real_fcntl = fcntl.fcntl
    monkeypatch.setattr(storage.os, "write", refusing_the_second)
    data = os.urandom(3 * storage.CHUNK + 77)

    name = document_store_memory("documents/d/source.pdf", held_in_a_body(data, offset=5))

    assert direct_writes == [storage.CHUNK, storage.CHUNK]  # one written directly, the second refused
    assert (media_root / name).read_bytes() == data


def test_a_direct_write_that_fails_otherwise_leaves_no_file(media_root, monkeypatch):
    real_write = os.write

    def disk_full(fd, data):
        if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data)

    monkeypatch.setattr(storage.os, "write", disk_full)

    with pytest.raises(OSError, match="No space"):
        document_store_memory("documents/e/source.pdf", held_in_a_body(os.urandom(storage.CHUNK), offset=9))

    assert not (media_root / "documents/e/source.pdf").exists()


def test_a_document_written_past_the_cache_is_read_into_it_before_the_loop_sends_it(media_root):
    if filesystem_type(media_root) == "tmpfs":
        pytest.skip("a tmpfs file lives in the page cache")
    data = os.urandom(2 * storage.CHUNK + 5)
    name = document_store_memory("documents/f/source.pdf", held_in_a_body(data, offset=11))
    assert resident_pages(media_root / name) <= 1

    body, file = document_body(name)  # in a thread of the dispatcher's, off its loop

    try:
        # Every page cached: the loop's sendfile waits on no disk.
        assert resident_pages(media_root / name) == -(-len(data) // mmap.PAGESIZE)
        assert body.size == len(data) and file.tell() == 0  # the file is sent whole, from its start
    finally:
        file.close()
