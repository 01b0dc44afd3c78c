"""Documents on their way to pods: which pod gets a page (affinity), a document sent once per pod.

A dispatch loop (``loop.DispatchLoop``) routes each page by its document: to a pod that holds the
document when one has a lane free, else, within bounds, a page further on first, else any free
lane, the document crossing once more. It knows which documents each pod holds as far as it sent
them (a 409 corrects it), and sends a document with one ``PUT /v1/documents/{sha256}`` per pod
that pages share. ``DocumentRoutes`` is that part of the loop, a mixin over the loop's lanes,
queue, HTTP client and I/O threads.

A document on this host's filesystem goes from the page cache to the socket in the kernel
(``sendfile``): the dispatcher neither reads it into memory nor copies it through Python. Read
whole and written by aiohttp, the 786 MB of the ingest benchmark were a quarter of the dispatch
loop's CPU. A document in object storage is read whole, as before (``document_bytes``).
"""

from __future__ import annotations

import asyncio
import functools
import os
import time
from collections import Counter, deque
from itertools import islice
from typing import TYPE_CHECKING, Any, BinaryIO

from aiohttp.payload import Payload
from django.conf import settings

from ocrjobs.dispatch.http import AnswerTooLarge, read_answer
from ocrjobs.dispatch.lanes import LaneTable, PodLanes
from ocrjobs.services.pages import ClaimedPage
from ocrjobs.storage import document_bytes, document_file
from podserver.answers import PodError

if TYPE_CHECKING:
    import aiohttp


class FileBody(Payload):
    """An open file sent by ``loop.sendfile`` once aiohttp has written the request's headers (and
    a Content-Length, from ``size``). The caller closes the file once the request is over."""

    def __init__(self, file: BinaryIO, size: int, **kwargs: Any):
        super().__init__(file, content_type="application/octet-stream", **kwargs)
        self._size = size

    async def write(self, writer) -> None:
        await self.write_with_length(writer, None)

    async def write_with_length(self, writer, content_length: int | None) -> None:
        count = self._size if content_length is None else min(self._size, content_length)
        writer.send_headers()  # aiohttp holds them back to go out with the first chunk of a body
        await asyncio.get_running_loop().sendfile(writer.transport, self._value, 0, count)

    def decode(self, encoding: str = "utf-8", errors: str = "strict") -> str:
        raise TypeError("a document's body is not text")


def document_body(source: str, *, sendfile: bool = True) -> tuple[FileBody | bytes, BinaryIO | None]:
    """What a PUT sends for the stored document ``source``, and the file to close after it (None:
    bytes read whole). ``sendfile`` False (a TLS connection, which the kernel cannot encrypt):
    read whole. Blocking (it opens or reads the file): run it off the loop."""
    file = document_file(source) if sendfile else None
    if file is None:
        return document_bytes(source), None
    try:
        size = os.fstat(file.fileno()).st_size
        _into_page_cache(file, size)
        return FileBody(file, size), file
    except BaseException:
        file.close()
        raise


def _into_page_cache(file: BinaryIO, size: int) -> None:
    """Read the file into the page cache here, off the loop, so that the loop's sendfile only
    copies from memory: an upload may have left the cache since it was stored, and a sendfile of a
    file not in it waits for the disk inside the loop (2.4-2.6 ms per 3.6 MB document on this
    machine, 0.3 ms cached). A sendfile to /dev/null reads the pages in and copies nothing."""
    with open(os.devnull, "wb") as null:
        sent = 0
        while sent < size:
            count = os.sendfile(null.fileno(), file.fileno(), sent, size - sent)
            if count == 0:  # the file got shorter: the PUT sends what is there
                return
            sent += count


# A page whose document's pods are all busy may let one further on go first (a page of a document
# that a pod with a free lane holds, or that no pod holds yet) rather than send its document to a
# second pod: looking this far down the queue at most.
AFFINITY_LOOK_AHEAD = 32
# A document whose pods are all busy, with nothing else to send while another pod's lane sits free,
# waits this long for one of them before its next page goes to the free lane (the document crosses
# to a second pod): a few page times of a fast pod, against a second copy of a document that may be
# tens of MB. The wait is the document's, not its first page's: its pods' lanes free up and take
# its pages one by one, and a wait that began again with each new first page never ended (a pod
# that came late read nothing while thousands of pages waited, and was shed idle).
AFFINITY_WAIT_SECONDS = 0.5
# ...unless its document has this many pages per pod that holds it: a long document spreads over
# the fleet at once (each copy paid for by that many pages), a short one stays on its pod.
AFFINITY_SPREAD_PAGES = 16
AFFINITY_HOLDERS_LOOKED_AT = 16


class DocumentRefused(Exception):
    """The pod would not take the document (PUT answered other than 200/201)."""

    def __init__(self, status: int, error: str):
        super().__init__(f"HTTP {status}: {error}")
        self.status = status


class PageQueue(deque):
    """The loop's queue of claimed pages, counting the pages queued per sha256 as they enter and
    leave (documents with the same bytes are one copy on a pod), so the affinity decision reads
    a count instead of scanning the queue."""

    def __init__(self, pages=()):
        super().__init__()
        self.per_sha256: Counter[str] = Counter()
        self.extend(pages)

    def append(self, page) -> None:
        super().append(page)
        self.per_sha256[page.sha256] += 1

    def appendleft(self, page) -> None:
        super().appendleft(page)
        self.per_sha256[page.sha256] += 1

    def extend(self, pages) -> None:
        for page in pages:
            self.append(page)

    def popleft(self):
        page = super().popleft()
        self._left(page)
        return page

    def pop(self):
        page = super().pop()
        self._left(page)
        return page

    def __delitem__(self, index) -> None:
        self._left(self[index])
        super().__delitem__(index)

    def remove(self, page) -> None:
        super().remove(page)
        self._left(page)

    def clear(self) -> None:
        super().clear()
        self.per_sha256.clear()

    def _left(self, page) -> None:
        left = self.per_sha256[page.sha256] - 1
        if left > 0:
            self.per_sha256[page.sha256] = left
        else:
            del self.per_sha256[page.sha256]


class DocumentRoutes:
    """The documents' side of a dispatch loop (mixed into ``DispatchLoop``, which sets ``lanes``,
    ``queue`` and ``client`` and offers ``io``): where each page goes, and each document sent once
    per pod."""

    lanes: LaneTable
    queue: PageQueue
    client: aiohttp.ClientSession

    def _documents_init(self) -> None:
        # Which documents each pod holds, as far as this loop knows (it sent them; a 409 corrects
        # it), both ways; and the PUTs out now, one per (pod, document), that pages share. A
        # document's holders are kept least recently sent a page first: a lease looks at only the
        # first few (PREFERRED_LOOKS), which would otherwise be the same few pods every time.
        self.held: dict[int, set[str]] = {}
        self.holders: dict[str, dict[int, None]] = {}
        self.puts: dict[tuple[int, str], asyncio.Future] = {}
        self.documents_sent = 0
        self.bytes_sent = 0
        # sha256 -> since when its pages have waited for its pods while a lane elsewhere sat free
        self.affinity_waits: dict[str, float] = {}

    def next_forward(self) -> tuple[ClaimedPage | None, PodLanes | None]:
        """The next page to send and its lane, taken off the queue (no lane: nothing taken). A page
        goes to a pod that holds its document when one has a lane free. When every pod holding it
        is busy, a page further on whose document needs no second crossing goes first (bounded
        look-ahead); failing that, the first page goes to any free lane, at once if its document is
        long (AFFINITY_SPREAD_PAGES pages per pod holding it), else after waiting a little for its
        document's pods (AFFINITY_WAIT_SECONDS) while a lane elsewhere stays free."""
        if not self.lanes.free:
            self.affinity_waits.clear()  # no lane idles: no document has been waiting for one
            return None, None
        looked_at: set[str] = set()
        for index, page in enumerate(islice(self.queue, AFFINITY_LOOK_AHEAD)):
            # A page of bytes looked at already in this pass gets the same answer (the same holders,
            # no lane free among them): pages of one long document, next to each other in the queue,
            # were each looked at again, a sixth of the loop's CPU at 64 pods x 8 lanes.
            if page.sha256 in looked_at:
                continue
            looked_at.add(page.sha256)
            # Pods that left this loop's lanes (drained, shunned) hold nothing it can use. A few are
            # looked at, however many hold a long document: the cost stays flat with the fleet.
            holding = islice(self.holders.get(page.sha256, ()), AFFINITY_HOLDERS_LOOKED_AT)
            holders = [pod_id for pod_id in holding if pod_id in self.lanes.pods]
            lane = self.lanes.lease(holders, anywhere=False) if holders else self.lanes.lease()
            if lane is not None:
                del self.queue[index]
                if holders:
                    self._served(page.sha256, lane.pod_id)
                return page, lane
            if not holders:
                return None, None
        head = self.queue[0]
        now = time.monotonic()
        waiting_since = self.affinity_waits.setdefault(head.sha256, now)
        queued = self.queue.per_sha256[head.sha256]
        holders = self.holders.get(head.sha256, ())
        # Long against every pod that holds its bytes is long against those of them in the lanes:
        # known without walking them (a walk per page of a long document grew with the fleet).
        long_for_all = max(head.pages, queued) >= AFFINITY_SPREAD_PAGES * len(holders)
        if now - waiting_since < AFFINITY_WAIT_SECONDS and not long_for_all:
            holding = [self.lanes.pods[pod_id] for pod_id in holders if pod_id in self.lanes.pods]
            # The pages queued for its bytes, not its one document's: many same-bytes documents
            # are one long document to the pods holding it. A second copy pays when the document is
            # long, or when the pages queued for its bytes are more, by a long document's worth,
            # than its pods' lanes will start next (the queue holds about twice the loop's lanes, so
            # it never shows a long document's pages per pod when several pods hold the bytes).
            long = max(head.pages, queued) >= AFFINITY_SPREAD_PAGES * len(holding)
            beyond = queued - sum(pod.lanes for pod in holding) >= AFFINITY_SPREAD_PAGES
            if not (long or beyond):
                return None, None  # the next lane its document's pods free takes it (or the loop's next turn)
        lane = self.lanes.lease()
        if lane is None:
            return None, None
        if head.sha256 not in self.held.get(lane.pod_id, ()):
            self.affinity_waits.pop(head.sha256, None)  # it crossed: a wait for its pods begins anew
        self._served(head.sha256, lane.pod_id)
        return self.queue.popleft(), lane

    def _served(self, sha256: str, pod_id: int) -> None:
        # To the back of the document's holders (if it holds it): the others are looked at first.
        pods = self.holders.get(sha256)
        if pods is not None and pods.pop(pod_id, False) is None:
            pods[pod_id] = None

    async def send_document(self, page: ClaimedPage, lane: PodLanes) -> None:
        """Make sure the pod holds the page's document: at most one PUT per (pod, document) is out
        at a time, and the pages that need it meanwhile wait for that one."""
        put = self.puts.get((lane.pod_id, page.sha256))
        if put is None and page.sha256 not in self.held.get(lane.pod_id, ()):
            put = self.start_put(page, lane)
        if put is not None:
            await asyncio.shield(put)

    def start_put(self, page: ClaimedPage, lane: PodLanes) -> asyncio.Future:
        """Send the page's document to the pod; from now on the pod counts as holding it (pages that
        come meanwhile go there and wait for this PUT), unless the PUT fails."""
        key = (lane.pod_id, page.sha256)
        self.remember(*key)
        put = asyncio.ensure_future(self.put_document(page, lane))
        self.puts[key] = put
        put.add_done_callback(lambda done: self.puts.pop(key, None) if self.puts.get(key) is done else None)
        return put

    async def put_document(self, page: ClaimedPage, lane: PodLanes) -> None:
        file = None
        try:
            # In the kernel (sendfile) over plain HTTP; read whole for TLS (RunPod's proxy).
            sendfile = lane.base_url.startswith("http://")
            body, file = await self.io(functools.partial(document_body, page.source, sendfile=sendfile))
            url = f"{lane.base_url}/v1/documents/{page.sha256}"
            async with self.client.put(url, data=body, headers=lane.headers) as response:
                status = response.status
                try:
                    answer = await read_answer(response, settings.POD_ANSWER_MAX_BYTES)
                except AnswerTooLarge:
                    response.close()  # the connection too: the rest of the answer is never read
                    raise
            if status not in (200, 201):
                raise DocumentRefused(status, error_of(answer))
        except BaseException:
            self.forget(lane.pod_id, page.sha256)
            raise
        finally:
            if file is not None:
                file.close()
        self.documents_sent += 1
        self.bytes_sent += body.size if isinstance(body, FileBody) else len(body)

    def remember(self, pod_id: int, sha256: str) -> None:
        self.held.setdefault(pod_id, set()).add(sha256)
        self.holders.setdefault(sha256, {})[pod_id] = None

    def forget(self, pod_id: int, sha256: str) -> None:
        self.held.get(pod_id, set()).discard(sha256)
        pods = self.holders.get(sha256)
        if pods is not None:
            pods.pop(pod_id, None)
            if not pods:
                del self.holders[sha256]

    def forget_pod(self, pod_id: int) -> None:
        for sha256 in self.held.pop(pod_id, set()):
            pods = self.holders.get(sha256)
            if pods is not None:
                pods.pop(pod_id, None)
                if not pods:
                    del self.holders[sha256]


def error_of(body: bytes) -> str:
    """The pod's error (podserver.answers.PodError), or the start of whatever else it sent."""
    try:
        return PodError.model_validate_json(body).error or body.decode(errors="replace")[:200]
    except ValueError:  # pydantic's ValidationError is one
        return body.decode(errors="replace")[:200]
