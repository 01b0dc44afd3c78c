"""The dispatch loop's queue of claimed pages, kept by document (``PageQueue``): what the
affinity decision (ocrjobs/dispatch/documents.py ``next_forward``) looks at."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator

from ocrjobs.services.pages import ClaimedPage


class PageQueue:
    """The loop's queue of claimed pages, kept by their documents' bytes (sha256; documents with the
    same bytes are one copy on a pod): the documents in the order their first page came (a page put
    back goes first), each its pages in order. So the affinity decision looks at the next few
    documents, however long each is (a look at the next few pages saw one long document and none of
    the others, whose pods idled), and reads a document's pages queued as a count."""

    def __init__(self, pages: Iterable[ClaimedPage] = ()) -> None:
        self._documents: dict[str, deque[ClaimedPage]] = {}
        self._length = 0
        self.extend(pages)

    def __len__(self) -> int:
        return self._length

    def __bool__(self) -> bool:
        return self._length > 0

    def __iter__(self) -> Iterator[ClaimedPage]:
        for pages in self._documents.values():
            yield from pages

    def head(self) -> ClaimedPage:
        """The page that comes first (IndexError: none)."""
        for pages in self._documents.values():
            return pages[0]
        raise IndexError("the queue is empty")

    def documents(self) -> Iterator[tuple[str, deque[ClaimedPage]]]:
        """(sha256, its pages), the documents in turn."""
        return iter(self._documents.items())

    def documents_queued(self) -> int:
        return len(self._documents)

    def queued(self, sha256: str) -> int:
        pages = self._documents.get(sha256)
        return len(pages) if pages is not None else 0

    def append(self, page: ClaimedPage) -> None:
        pages = self._documents.get(page.sha256)
        if pages is None:
            pages = self._documents[page.sha256] = deque()
        pages.append(page)
        self._length += 1

    def extend(self, pages: Iterable[ClaimedPage]) -> None:
        for page in pages:
            self.append(page)

    def appendleft(self, page: ClaimedPage) -> None:
        """The page first, and its document's pages with it."""
        first = next(iter(self._documents), None)
        if first == page.sha256:
            self._documents[first].appendleft(page)
        else:
            pages = self._documents.pop(page.sha256, None) or deque()
            pages.appendleft(page)
            self._documents = {page.sha256: pages, **self._documents}
        self._length += 1

    def popleft(self) -> ClaimedPage:
        return self.take(self.head().sha256)

    def take(self, sha256: str) -> ClaimedPage:
        """The first page queued of the document with these bytes, taken off the queue."""
        pages = self._documents[sha256]
        page = pages.popleft()
        if not pages:
            del self._documents[sha256]
        self._length -= 1
        return page

    def clear(self) -> None:
        self._documents.clear()
        self._length = 0
