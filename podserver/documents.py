"""The pod's document cache: whole documents on disk, named by their sha256, evicted least recently used.

A document crosses to a pod once (DESIGN invariant 16): the dispatcher PUTs it, then asks for
its pages by hash, and the pod renders them itself. The cache is bounded by bytes; a document a
running page holds (``with cache.use(sha) as path``) is never evicted under it, so the cache may
run over its capacity by at most the documents the lanes hold, and shrinks back as they finish.

A write streams into a temporary file in the cache directory, checks the hash, and renames it
into place: a crash leaves a stray ``.part`` file (swept at start-up), never half a document
under a real name.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

SHA256 = re.compile(r"[0-9a-f]{64}")
CHUNK = 1024 * 1024
PART_SUFFIX = ".part"


class DocumentError(ValueError):
    """The upload is not a document this pod keeps (hash mismatch, not a PDF/image, short body)."""


class CacheFull(Exception):
    """The document is larger than the whole cache."""


@dataclass
class Entry:
    bytes: int
    pages: int
    pins: int = 0


class DocumentCache:
    def __init__(self, directory: str | os.PathLike | None, capacity_bytes: int) -> None:
        self._own_directory = not directory  # a temporary one, removed by close()
        if directory:
            self.directory = Path(directory)
            self.directory.mkdir(parents=True, exist_ok=True)
        else:
            self.directory = Path(tempfile.mkdtemp(prefix="podserver-documents-"))
        self.capacity_bytes = capacity_bytes
        self._lock = threading.Lock()
        self._entries: OrderedDict[str, Entry] = OrderedDict()  # least recently used first
        self._bytes = 0
        self._reserved = 0  # bytes of uploads being written now
        self._adopt_existing()

    def _adopt_existing(self) -> None:
        # A pod restarted on the same volume keeps what it had; page counts are taken lazily.
        found = []
        for path in self.directory.iterdir():
            if path.name.endswith(PART_SUFFIX):
                path.unlink(missing_ok=True)  # a write that a crash cut short
            elif SHA256.fullmatch(path.name) and path.is_file():
                stat = path.stat()
                found.append((stat.st_mtime, path.name, stat.st_size))
        for _, name, size in sorted(found):
            self._entries[name] = Entry(bytes=size, pages=0)
            self._bytes += size
        self._evict()

    def close(self) -> None:
        if self._own_directory:
            shutil.rmtree(self.directory, ignore_errors=True)

    def path(self, sha256: str) -> Path:
        return self.directory / sha256

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {"count": len(self._entries), "bytes": self._bytes, "capacity_bytes": self.capacity_bytes}

    def get(self, sha256: str) -> Entry | None:
        with self._lock:
            return self._entries.get(sha256)

    def put(
        self,
        sha256: str,
        length: int,
        body: BinaryIO,
        count_pages: Callable[[Path], int],
    ) -> tuple[Entry, bool]:
        """Store ``length`` bytes read from ``body`` as ``sha256``; (entry, created).

        ``count_pages`` opens the written file and raises DocumentError if it is no document.
        """
        if length > self.capacity_bytes:
            raise CacheFull(f"document of {length} bytes exceeds the cache capacity of {self.capacity_bytes}")
        with self._lock:
            self._reserved += length
            self._evict()
        try:
            return self._write(sha256, length, body, count_pages)
        finally:
            with self._lock:
                self._reserved -= length

    def _write(
        self, sha256: str, length: int, body: BinaryIO, count_pages: Callable[[Path], int]
    ) -> tuple[Entry, bool]:
        digest = hashlib.sha256()
        fd, part = tempfile.mkstemp(dir=self.directory, prefix=f".{sha256[:12]}-", suffix=PART_SUFFIX)
        try:
            with os.fdopen(fd, "wb") as out:
                remaining = length
                while remaining:
                    chunk = body.read(min(CHUNK, remaining))
                    if not chunk:
                        raise DocumentError(f"incomplete body: {length - remaining} of {length} bytes")
                    digest.update(chunk)
                    out.write(chunk)
                    remaining -= len(chunk)
            if digest.hexdigest() != sha256:
                raise DocumentError(f"body's sha256 is {digest.hexdigest()}, not the {sha256} it was sent as")
            pages = count_pages(Path(part))
            with self._lock:
                existing = self._entries.get(sha256)
                if existing is not None:  # a concurrent upload of the same document won
                    self._entries.move_to_end(sha256)
                    return existing, False
                os.replace(part, self.path(sha256))
                entry = self._entries[sha256] = Entry(bytes=length, pages=pages)
                self._bytes += length
                return entry, True
        finally:
            Path(part).unlink(missing_ok=True)

    def touch(self, sha256: str) -> Entry | None:
        with self._lock:
            entry = self._entries.get(sha256)
            if entry is not None:
                self._entries.move_to_end(sha256)
            return entry

    def set_pages(self, sha256: str, pages: int) -> None:
        with self._lock:
            if (entry := self._entries.get(sha256)) is not None:
                entry.pages = pages

    @contextmanager
    def use(self, sha256: str) -> Iterator[tuple[Path, Entry] | None]:
        """Pin a cached document for the length of the block; None when it is not cached."""
        with self._lock:
            entry = self._entries.get(sha256)
            if entry is not None:
                entry.pins += 1
                self._entries.move_to_end(sha256)
        if entry is None:
            yield None
            return
        try:
            yield self.path(sha256), entry
        finally:
            with self._lock:
                entry.pins -= 1
                self._evict()

    def _evict(self) -> None:
        """Drop least recently used, unpinned documents until what is kept plus what is being written fits."""
        # Called with the lock held.
        for sha256 in list(self._entries):
            if self._bytes + self._reserved <= self.capacity_bytes:
                return
            entry = self._entries[sha256]
            if entry.pins:
                continue
            del self._entries[sha256]
            self._bytes -= entry.bytes
            self.path(sha256).unlink(missing_ok=True)


def valid_name(name: str) -> bool:
    return SHA256.fullmatch(name) is not None
