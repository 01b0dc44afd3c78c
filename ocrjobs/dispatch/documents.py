"""Documents on their way to pods: which pod gets a page (affinity), a document sent once per pod.

A dispatch loop (``loop.DispatchLoop``) routes each page by its document: to a pod that holds the
document when one has a lane free, else, within bounds, a page further on first, else any free
lane, the document crossing once more. It knows which documents each pod holds as far as it sent
them (a 409 corrects it), and sends a document with one ``PUT /v1/documents/{sha256}`` per pod
that pages share. ``DocumentRoutes`` is that part of the loop, a mixin over the loop's lanes,
queue, HTTP client and I/O threads.

A dispatcher sends at most DISPATCH_DOCUMENT_BYTES_IN_FLIGHT of documents at once
(``DocumentGate``), first asked first sent: a document read whole (TLS) is in memory a few at a
time, not one copy per pod that asked, and the first pods start reading while the others' copies
are on their way. (One 5.2 MB document sent to 256 pods at once: every lane's first page at 4.9 s
against the ideal 2.0; 16 or 64 MiB at a time: 3.9 and 4.0 s.)

A document on this host's filesystem goes from the page cache to the socket in the kernel
(``sendfile``): the dispatcher neither reads it into memory nor copies it through Python. Read
whole and written by aiohttp, the 786 MB of the ingest benchmark were a quarter of the dispatch
loop's CPU. A document in object storage is read whole, as before (``document_bytes``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import time
from collections import deque
from collections.abc import AsyncIterator
from itertools import islice
from typing import TYPE_CHECKING, Any, BinaryIO

from aiohttp.payload import Payload
from django.conf import settings

from ocrjobs.dispatch.http import AnswerTooLarge, read_answer
from ocrjobs.dispatch.lanes import LaneTable, PodLanes
from ocrjobs.dispatch.queue import PageQueue
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


class DocumentWaited(Exception):
    """A document waited for room at the gate longer than its deadline: nothing reached the pod."""


class DocumentGate:
    """At most ``limit`` bytes of documents on their way at once, first come first served: a
    document waits while the ones ahead of it, or the bytes out now, leave no room (one larger
    than ``limit`` goes alone, once nothing else is out), and no longer than ``within`` seconds
    (DocumentWaited): each PUT ahead of it has a deadline, but many of them add up."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0
        self._waiting: deque[tuple[int, asyncio.Future]] = deque()

    @contextlib.asynccontextmanager
    async def room(self, size: int, *, within: float | None = None) -> AsyncIterator[None]:
        size = max(size, 1)
        if self._waiting or not self._fits(size):
            turn = asyncio.get_running_loop().create_future()
            entry = (size, turn)
            self._waiting.append(entry)
            try:
                async with asyncio.timeout(within):
                    await turn
            except BaseException as exc:
                if entry in self._waiting:
                    self._waiting.remove(entry)
                    self._admit()  # (the ones behind it may fit now)
                elif turn.done() and not turn.cancelled():
                    self._leave(size)  # (given room, then cancelled before it took it)
                if isinstance(exc, TimeoutError):
                    raise DocumentWaited(f"no room for the document within {within:g} s") from exc
                raise
        else:
            self.held += size
        try:
            yield
        finally:
            self._leave(size)

    def _fits(self, size: int) -> bool:
        return self.held == 0 or self.held + size <= self.limit

    def _leave(self, size: int) -> None:
        self.held -= size
        self._admit()

    def _admit(self) -> None:
        while self._waiting:
            size, turn = self._waiting[0]
            if turn.done():  # (cancelled, its clean-up still to run: it finds itself out of line)
                self._waiting.popleft()
                continue
            if not self._fits(size):
                return
            self._waiting.popleft()
            self.held += size
            turn.set_result(None)


# A page whose document's pods are all busy may let one of another document go first (one that a pod
# with a free lane holds, or that no pod holds yet) rather than send its document to a second pod:
# looking at this many documents at most, however many pages each has queued.
AFFINITY_LOOK_AHEAD = 32
# ...and further, at this many, for a document no pod holds yet (a look at each is a dict's): with
# many short documents queued and the first ones' pods busy, lanes idled while new ones waited.
AFFINITY_NEW_LOOK_AHEAD = 512
# A document whose pods are all busy, with nothing else to send while another pod's lane sits free,
# waits this long for one of them before its next page goes to the free lane (the document crosses
# to a second pod): a few page times of a fast pod, against a second copy of a document that may be
# tens of MB. The wait is the document's, not its first page's: its pods' lanes free up and take
# its pages one by one, and a wait that began again with each new first page never ended (a pod
# that came late read nothing while thousands of pages waited, and was shed idle).
AFFINITY_WAIT_SECONDS = 0.5
# ...or as long as sending it to another pod would take, at this many bytes a second, if that is
# less (0 bytes: not known, the whole wait): with hundreds of lanes free and the next documents'
# pods busy, a copy of a document of a few pages' bytes costs less than the lanes' half second.
AFFINITY_COPY_BYTES_PER_SECOND = 50 * 1024 * 1024


def affinity_wait(page: ClaimedPage) -> float:
    """How long the page's document waits for its pods while a lane elsewhere is free."""
    if page.size <= 0:
        return AFFINITY_WAIT_SECONDS
    return min(AFFINITY_WAIT_SECONDS, page.size / AFFINITY_COPY_BYTES_PER_SECOND)


# ...unless its document has this many pages per pod that holds it: a long document spreads over
# the fleet at once (each copy paid for by that many pages), a short one stays on its pod.
AFFINITY_SPREAD_PAGES = 16
AFFINITY_HOLDERS_LOOKED_AT = 16


class DocumentRefused(Exception):
    """The pod would not take the document (PUT answered other than 200/201)."""

    def __init__(self, status: int, error: str):
        super().__init__(f"HTTP {status}: {error}")
        self.status = status


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
        self.document_gate = DocumentGate(settings.DISPATCH_DOCUMENT_BYTES_IN_FLIGHT)
        # A document waits for room at the gate no longer than a page waits for its pod.
        self.document_wait_seconds = settings.PAGE_TIMEOUT_SECONDS + 10

    def next_forward(self) -> tuple[ClaimedPage | None, PodLanes | None]:
        """The next page to send and its lane, taken off the queue (no lane: nothing taken). The next
        AFFINITY_LOOK_AHEAD documents are looked at in turn: a page goes to a pod that holds its
        document when one has a lane free, and a page of a document no pod holds goes to any free
        lane. When every document looked at has pods and they are all busy, the first for which a
        second copy pays takes any free lane: at once if it is long (AFFINITY_SPREAD_PAGES pages
        per pod holding it, or pages queued past what its pods start next), else once it has
        waited AFFINITY_WAIT_SECONDS for its pods while a lane elsewhere stayed free."""
        if not self.lanes.free:
            self.affinity_waits.clear()  # no lane idles: no document has been waiting for one
            return None, None
        looked_at = list(islice(self.queue.documents(), AFFINITY_LOOK_AHEAD))
        for sha256, _ in looked_at:
            # Pods that left this loop's lanes (drained, shunned) hold nothing it can use. A few are
            # looked at, however many hold a long document: the cost stays flat with the fleet.
            holding = islice(self.holders.get(sha256, ()), AFFINITY_HOLDERS_LOOKED_AT)
            holders = [pod_id for pod_id in holding if pod_id in self.lanes.pods]
            if not holders:
                lane = self.lanes.lease()
                if lane is None:
                    return None, None  # no lane free anywhere
                return self.queue.take(sha256), lane
            lane = self.lanes.lease(holders, anywhere=False) or self.lanes.lease_where(
                functools.partial(self._holds, sha256)
            )
            if lane is not None:
                self._served(sha256, lane.pod_id)
                return self.queue.take(sha256), lane
        # From the free lanes' side: a pod that holds a document further on in the queue.
        lane = self.lanes.lease_where(self._holds_queued)
        if lane is not None:
            sha256 = next(sha256 for sha256 in self.held[lane.pod_id] if self.queue.queued(sha256))
            self._served(sha256, lane.pod_id)
            return self.queue.take(sha256), lane
        # A document further on that no pod holds yet: to any free lane, before a second copy.
        for sha256, _ in islice(self.queue.documents(), AFFINITY_LOOK_AHEAD, AFFINITY_NEW_LOOK_AHEAD):
            if not self.holders.get(sha256):
                lane = self.lanes.lease()
                return (self.queue.take(sha256), lane) if lane is not None else (None, None)
        now = time.monotonic()
        for sha256, pages in looked_at:
            waiting_since = self.affinity_waits.setdefault(sha256, now)
            if now - waiting_since < affinity_wait(pages[0]) and not self._copy_pays(sha256, pages):
                continue  # the next lane its document's pods free takes it (or the loop's next turn)
            lane = self.lanes.lease()
            if lane is None:
                return None, None
            if sha256 not in self.held.get(lane.pod_id, ()):
                self.affinity_waits.pop(sha256, None)  # it crossed: a wait for its pods begins anew
            self._served(sha256, lane.pod_id)
            return self.queue.take(sha256), lane
        return None, None

    def _holds(self, sha256: str, pod_id: int) -> bool:
        return sha256 in self.held.get(pod_id, ())

    def _holds_queued(self, pod_id: int) -> bool:
        """Whether the pod holds a document with pages queued: its documents looked up in the queue,
        or the queue's in its documents, whichever are fewer (a look at each is a dict's)."""
        held = self.held.get(pod_id)
        if not held:
            return False
        if len(held) <= self.queue.documents_queued():
            return any(self.queue.queued(sha256) for sha256 in held)
        return any(sha256 in held for sha256, _ in self.queue.documents())

    def _copy_pays(self, sha256: str, pages: deque[ClaimedPage]) -> bool:
        """Whether the document with these bytes, its pods all busy, is worth a copy on another pod
        now: long (AFFINITY_SPREAD_PAGES pages a pod that holds it), or with pages queued, by a long
        document's worth, past what its pods' lanes start next."""
        queued = len(pages)
        longest = max(pages[0].pages, queued)
        holders = self.holders.get(sha256, ())
        # Long against every pod that holds its bytes is long against those of them in the lanes:
        # known without walking them (a walk per page of a long document grew with the fleet).
        if longest >= AFFINITY_SPREAD_PAGES * len(holders):
            return True
        holding = [self.lanes.pods[pod_id] for pod_id in holders if pod_id in self.lanes.pods]
        # The pages queued for its bytes, not its one document's: many same-bytes documents are one
        # long document to the pods holding it. A second copy pays when the document is long, or
        # when the pages queued for its bytes are more, by a long document's worth, than its pods'
        # lanes will start next (the queue holds about twice the loop's lanes, so it never shows a
        # long document's pages per pod when several pods hold the bytes).
        if longest >= AFFINITY_SPREAD_PAGES * len(holding):
            return True
        return queued - sum(pod.lanes for pod in holding) >= AFFINITY_SPREAD_PAGES

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
            async with self.document_gate.room(page.size, within=self.document_wait_seconds):
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
