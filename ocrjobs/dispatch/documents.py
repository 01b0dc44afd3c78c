"""Documents on their way to pods: which pod gets a page (affinity), a document sent once per pod.

A dispatch loop (``loop.DispatchLoop``) routes each page by its document: to a pod that holds the
document when one has a lane free, else, within bounds, a page further on first, else any free
lane, the document crossing once more. It knows which documents each pod holds as far as it sent
them (a 409 corrects it), and sends a document with one ``PUT /v1/documents/{sha256}`` per pod
that pages share. ``DocumentRoutes`` is that part of the loop, a mixin over the loop's lanes,
queue, HTTP client and I/O threads. What its PUTs send, and the gate they pass: sending.py.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections import deque
from itertools import islice
from typing import TYPE_CHECKING

from django.conf import settings

from ocrjobs.dispatch.http import AnswerTooLarge, read_answer
from ocrjobs.dispatch.lanes import LaneTable, PodLanes
from ocrjobs.dispatch.queue import PageQueue
from ocrjobs.dispatch.sending import DocumentGate, FileBody, document_body
from ocrjobs.services.pages import ClaimedPage
from podserver.answers import PodError

if TYPE_CHECKING:
    import aiohttp


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
            sha256 = self._held_queued(lane.pod_id)
            self._served(sha256, lane.pod_id)
            return self.queue.take(sha256), lane
        # A document further on that no pod holds yet: to any free lane, before a second copy.
        for sha256, _ in islice(self.queue.documents(), AFFINITY_LOOK_AHEAD, AFFINITY_NEW_LOOK_AHEAD):
            if not self.holders.get(sha256):
                lane = self.lanes.lease()
                return (self.queue.take(sha256), lane) if lane is not None else (None, None)
        sha256 = self._copied_next(looked_at)
        if sha256 is None:
            return None, None  # the next lane its documents' pods free takes them (or the loop's next turn)
        lane = self.lanes.lease()
        if lane is None:
            return None, None
        if sha256 not in self.held.get(lane.pod_id, ()):
            self.affinity_waits.pop(sha256, None)  # it crossed: a wait for its pods begins anew
        self._served(sha256, lane.pod_id)
        return self.queue.take(sha256), lane

    def _copied_next(self, looked_at: list[tuple[str, deque[ClaimedPage]]]) -> str | None:
        """Of the documents looked at, all their pods busy, the one that gets a copy on another pod
        now: of those for which a copy pays, or which waited long enough for their pods, the one with
        the most pages queued for each pod that holds it (the first of them on a tie). The first in
        line, as it was, took every copy while a copy paid: with a job's long documents queued
        together (claim_order), its first document went to ~190 pods, and the others waited."""
        now = time.monotonic()
        chosen, most = None, -1.0
        for sha256, pages in looked_at:
            waiting_since = self.affinity_waits.setdefault(sha256, now)
            if now - waiting_since < affinity_wait(pages[0]) and not self._copy_pays(sha256, pages):
                continue
            share = len(pages) / (len(self.holders.get(sha256, ())) + 1)
            if share > most:
                chosen, most = sha256, share
        return chosen

    def _holds(self, sha256: str, pod_id: int) -> bool:
        return sha256 in self.held.get(pod_id, ())

    def _holds_queued(self, pod_id: int) -> bool:
        return self._held_queued(pod_id) is not None

    def _held_queued(self, pod_id: int) -> str | None:
        """A document the pod holds with pages queued (None: none): its documents looked up in the
        queue, or the queue's in its documents, whichever are fewer (a look at each is a dict's)."""
        held = self.held.get(pod_id)
        if not held:
            return None
        if len(held) <= self.queue.documents_queued():
            return next((sha256 for sha256 in held if self.queue.queued(sha256)), None)
        return next((sha256 for sha256, _ in self.queue.documents() if sha256 in held), None)

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
