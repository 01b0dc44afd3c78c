"""A dispatcher: one asyncio loop with many page forwards in flight.

It claims pages (with a lease that it renews), leases a lane on a ready pod —
preferring a pod that holds the page's document —, sends the document once if
the pod lacks it (``PUT /v1/documents/{sha256}``, its own bytes), asks for the
page (``POST /v1/ocr`` with the document's hash and the page number: the pod
renders it), stores the result once, frees the lane, and ends when the pool's
backlog is empty. Database work runs on one thread of its own, never on the loop
and never on the default executor. Every request to a pod carries its token.

Length: one state machine (claims ahead, forwards in flight, results batched, beats,
drains) whose races are tested as a whole (tests/ocrjobs/test_dispatch_races.py); the
lane table (lanes.py), the documents' routing (documents.py: affinity, which pods hold
which documents, PUTs), the database calls (database.py) and what a pod's HTTP status makes
of an attempt (outcomes.py) are apart. Split further, each part would reach into the loop's
shared state.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import functools
import hashlib
import json
import logging
import ssl
import time
from concurrent.futures import ThreadPoolExecutor

import aiohttp
from django.conf import settings
from pydantic import ValidationError

from fleetadmin.collector import quiet_collector
from fleetadmin.db import DB_ERRORS
from fleetadmin.loopwatch import LoopWatch
from ocrjobs.dispatch import database
from ocrjobs.dispatch.documents import DocumentRefused, DocumentRoutes, error_of
from ocrjobs.dispatch.http import AnswerTooLarge, PodPages, PodRefused, pod_session
from ocrjobs.dispatch.lanes import LaneTable, PodLanes
from ocrjobs.dispatch.outcomes import status_failure
from ocrjobs.dispatch.queue import PageQueue
from ocrjobs.dispatch.sending import DocumentWaited
from ocrjobs.models import Dispatcher
from ocrjobs.selectors import pages_waiting
from ocrjobs.services.dispatchers import dispatch_ensure, dispatcher_end, dispatcher_register
from ocrjobs.services.jobs import jobs_refresh
from ocrjobs.services.pages import (
    ClaimedPage,
    PageResult,
    page_attempt_failed,
    pages_claim,
    pages_unclaim,
)
from ocrjobs.storage import document_bytes
from pods.services import preemption
from pods.services.lifecycle import pod_drain
from podserver.answers import PageAnswer

log = logging.getLogger(__name__)

POD_REFRESH_SECONDS = 1.0
HEARTBEAT_SECONDS = 2.0
# A beat renews the claims that would expire within this many seconds, not all of them (a renewal
# writes the page's row again): at least 3 beats before a claim would expire, however short it is.
RENEW_BEATS = 3
JOB_REFRESH_SECONDS = 0.5
FLUSH_SECONDS = 0.05
FLUSH_BACKOFF_MAX_SECONDS = 5.0
SWEEP_SECONDS = 5.0
CLAIM_BACKOFF_SECONDS = 0.2
SCALER_NUDGE_SECONDS = 15.0
REASON_LOG_SECONDS = 15.0
IDLE_EXIT_SECONDS = 3.0
NO_POD_EXIT_SECONDS = 30.0
POD_FAILURES_TO_DRAIN = 5
# A pod that refuses a connection leaves this dispatcher's lanes at once (its page
# goes to another lane, no attempt spent); refusing again after that drains it.
REFUSED_SHUN_SECONDS = 10.0
REFUSALS_TO_DRAIN = 2
# A pod that fails a page or refuses a connection may have been preempted: the provider is asked
# at once (interruptible pods only), then at most this often per pod. Left to the scaler's tick,
# a preempted pod's pages and its replacement waited up to a tick (15 s) after its first 502.
PREEMPTION_CHECK_SECONDS = 5.0
# A loop blocked this long while a page was out may itself have missed the pod's answer.
BLOCKED_EXCUSES_TIMEOUT_SECONDS = 1.0
# A pod that answers "document not cached" again right after it took the document (it evicts
# at once: a cache smaller than the document) is asked this many times in all.
DOCUMENT_SENDS = 3


class DispatchLoop(DocumentRoutes):
    def __init__(self, dispatcher: Dispatcher):
        self.dispatcher = dispatcher
        self.pool_id = dispatcher.pool_id
        self.token = dispatcher.token
        self.lanes = LaneTable()
        self.queue: PageQueue = PageQueue()
        self.flights: set[asyncio.Task] = set()
        # page id -> the newest claim on it, while a forward is out for it; and that forward's task
        self.inflight: dict[int, ClaimedPage] = {}
        self.forwarding: dict[int, asyncio.Task] = {}
        self.touched_jobs: set[int] = set()
        self.results: list[PageResult] = []
        self.storing: set[int] = set()  # pages whose results are being stored now
        self.assignments: list[tuple[int, int, int]] = []
        self.refusals: dict[int, int] = {}  # pod id -> connections refused since its last answer
        self.shunned: dict[int, float] = {}  # pod id -> monotonic time until which it gets no page
        self.drained: set[int] = set()  # pods this loop drained: never back, whatever a stale read says
        self.preemption_checked: dict[int, float] = {}  # pod id -> monotonic time its provider was last asked
        self.watch: LoopWatch | None = None  # the loop's lag sampler, set by _watched()
        self.done = 0
        self.failed = 0
        self._db = ThreadPoolExecutor(1, thread_name_prefix="dispatch-db")
        self._io = ThreadPoolExecutor(4, thread_name_prefix="dispatch-io")
        self._last_reason_log = -REASON_LOG_SECONDS
        self.hit_time_limit = False
        self._last_nudge = -1e9
        # Pages' POSTs to pods, plain or TLS, on ``client`` as documents' PUTs are (set by run()).
        self.pods: PodPages | None = None
        # Pods' certificates are checked against this (None: the system's CAs, hostname checked too).
        self.ssl_context: ssl.SSLContext | None = None
        self._documents_init()

    async def db(self, fn, /, **kwargs):
        """Run a database call on the loop's own database thread; once more on a fresh
        connection if the database dropped ours (every call here is safe to repeat)."""
        loop = asyncio.get_running_loop()
        for attempt in (1, 2, 3):
            context = contextvars.copy_context()
            call = functools.partial(context.run, fn, **kwargs)
            try:
                return await loop.run_in_executor(self._db, call)
            except DB_ERRORS as exc:
                if attempt == 3:
                    raise
                log.warning("dispatcher %s: database error (%s); again on a fresh connection", self.dispatcher.pk, exc)
                await loop.run_in_executor(self._db, database.close_connection)
                await asyncio.sleep(0.5 * attempt)

    async def io(self, fn, /, *args):
        return await asyncio.get_running_loop().run_in_executor(self._io, fn, *args)

    async def run(self) -> None:
        with quiet_collector():  # its full collections held the loop for up to 308 ms (fleetadmin/collector.py)
            await self._run()

    async def _run(self) -> None:
        started = time.monotonic()
        deadline = started + settings.DISPATCH_MAX_SECONDS
        # aiohttp rather than httpx: against a zero-latency pod httpx's async client does ~160
        # requests/s, aiohttp ~2,500 (2-core machine). One session: documents' PUTs and pages' POSTs, one
        # verifying context (a pod's PUTs and POSTs trust the same CAs), one deadline per request.
        page_deadline = settings.PAGE_TIMEOUT_SECONDS + 10
        self.wakeup = asyncio.Event()
        last_refresh = last_beat = last_jobs = -1e9
        self._last_sweep, self._claim_again_at = -1e9, 0.0
        idle_since: float | None = None
        no_pod_since: float | None = None
        flusher = None
        try:
            async with pod_session(deadline=page_deadline, ssl_context=self.ssl_context) as self.client:
                self.pods = PodPages(self.client, deadline=page_deadline, max_bytes=settings.POD_ANSWER_MAX_BYTES)
                flusher = asyncio.ensure_future(self.flush_forever())
                while True:
                    now = time.monotonic()
                    if now - last_refresh >= POD_REFRESH_SECONDS:
                        await self.refresh_pods()
                        last_refresh = now
                    if now - last_beat >= HEARTBEAT_SECONDS:
                        await self.heartbeat()
                        last_beat = now
                    elif self.touched_jobs and now - last_jobs >= JOB_REFRESH_SECONDS:
                        await self.refresh_jobs()
                        last_jobs = now
                    stopping = self.hit_time_limit = now > deadline
                    if not stopping:
                        await self.claim_ahead(now)
                    self.start_forwards()
                    if self.queue and not self.lanes.free:
                        self.note_no_lane()
                    no_pod_since = (no_pod_since or now) if self.lanes.total == 0 else None
                    if not self.flights and not self.queue and not self.results:
                        idle_since = idle_since or now
                        if stopping or now - idle_since >= IDLE_EXIT_SECONDS:
                            if stopping or await self.try_finish():
                                break
                            idle_since = None
                    else:
                        idle_since = None
                    if no_pod_since and now - no_pod_since >= NO_POD_EXIT_SECONDS and not self.flights:
                        log.info("dispatcher %s: no pod for %.0f s, leaving it to the scaler", self.dispatcher.pk,
                                 NO_POD_EXIT_SECONDS)  # fmt: skip
                        break
                    try:
                        await asyncio.wait_for(self.wakeup.wait(), timeout=0.25)
                    except TimeoutError:
                        pass
                    self.wakeup.clear()
        finally:
            await self.wind_down(flusher)
        log.info("dispatcher %s ended: %d pages done, %d failed in %.1f s; %d documents sent (%d bytes)",
                 self.dispatcher.pk, self.done, self.failed, time.monotonic() - started, self.documents_sent,
                 self.bytes_sent)  # fmt: skip

    async def flush_forever(self) -> None:
        """Flush every FLUSH_SECONDS. A flush that fails (the database away for longer than
        ``db`` retries) keeps its batch for the next one, which waits longer each time, up to
        FLUSH_BACKOFF_MAX_SECONDS: results are stored once the database answers again, and this
        task never ends on an error (if it did, no later flush would store anything)."""
        failures = 0
        while True:
            await asyncio.sleep(min(FLUSH_SECONDS * 2**failures, FLUSH_BACKOFF_MAX_SECONDS))
            try:
                await self.flush()
            except Exception:
                failures += 1
                log.exception("dispatcher %s: results not stored (flush %d failed); kept for the next flush",
                              self.dispatcher.pk, failures)  # fmt: skip
            else:
                failures = 0

    async def flush(self) -> None:
        """Store the results gathered since the last flush in one statement, and the pods that
        the other pages went to in another, on one trip to the database thread. A page whose
        result goes with them, on the attempt it went out on, needs no assignment: its result
        names its pod (at zero-latency pods nearly every page's assignment and result met in one
        flush: a statement and a trip saved)."""
        if not self.assignments and not self.results:
            return
        taken, self.assignments = self.assignments, []
        results, self.results = self.results, []
        assignments = taken
        storing = {item.page_id for item in results}
        # Stored or refused on the same claim (token, attempt) as the assignment would be.
        answered = {(item.page_id, item.attempt) for item in results}
        assignments = [row for row in assignments if (row[0], row[1]) not in answered]
        self.storing |= storing
        try:
            stored = await self.db(database.store, token=self.token, assignments=assignments, results=results)
        except BaseException:
            # The batch goes back, ahead of what came since (storing it again is safe: database.store).
            self.assignments[:0] = taken
            self.results[:0] = results
            raise
        finally:
            self.storing -= storing
        if results:
            self.done += len(stored)
            self.touched_jobs.update(item.job_id for item in results)
            self.wakeup.set()

    async def try_finish(self) -> bool:
        """End when no page waits; ending first, then looking again, closes the gap
        in which a page submitted now would find a dispatcher that is leaving."""
        if await self.db(pages_waiting, pool_id=self.pool_id):
            return False
        await self.db(dispatcher_end, dispatcher=self.dispatcher)
        if not await self.db(pages_waiting, pool_id=self.pool_id):
            return True
        await self.db(database.revive, dispatcher_id=self.dispatcher.pk)
        return False

    async def claim_ahead(self, now: float) -> None:
        """Keep one claimed page waiting per lane, so that a lane that frees up starts its next page
        at once; claim in batches, not page by page, and less often once the backlog is (nearly)
        empty."""
        room = self.lanes.free + self.lanes.total - len(self.queue)
        worth_it = room >= max(1, self.lanes.total // 4) or (not self.queue and self.lanes.free)
        if not worth_it or now < self._claim_again_at:
            return
        sweep = now - self._last_sweep >= SWEEP_SECONDS
        claimed = await self.db(pages_claim, pool_id=self.pool_id, token=self.token, limit=room, sweep=sweep)
        self._last_sweep = now if sweep else self._last_sweep
        self.queue.extend(claimed)
        if len(claimed) < room:
            self._claim_again_at = now + CLAIM_BACKOFF_SECONDS

    async def wind_down(self, flusher: asyncio.Future | None) -> None:
        """The loop's end, whatever ended it: its results stored, the pages it holds given back,
        its jobs refreshed, its row ended and its counts saved, the scaler told."""
        if flusher is not None:
            flusher.cancel()
        await self.flush()
        if self.queue:
            await self.db(pages_unclaim, token=self.token, page_ids=[p.id for p in self.queue])
            self.queue.clear()
        await self.refresh_jobs()
        await self.db(dispatcher_end, dispatcher=self.dispatcher)
        await self.db(database.save_counts, dispatcher_id=self.dispatcher.pk, done=self.done, failed=self.failed)
        await self.db(database.nudge_scaler, pool_id=self.pool_id)  # idle now: the scaler may shed
        await self.db(database.close_connection)
        # Never join threads on the loop: queued work still finishes after this returns.
        self._db.shutdown(wait=False)
        self._io.shutdown(wait=False)

    def start_forwards(self) -> None:
        while self.queue:
            if self.queue.head().id in self.forwarding:
                # Claimed again while its forward is still out (the pod it went to was
                # declared lost): that forward now stands for the newer attempt.
                page = self.queue.popleft()
                self.inflight[page.id] = page
                continue
            page, lane = self.next_forward()
            if lane is None:
                return
            if page.id in self.forwarding:
                # Claimed again while its forward is still out (the pod it went to was
                # declared lost): that forward now stands for the newer attempt.
                self.inflight[page.id] = page
                self.lanes.release(lane)
                continue
            self.inflight[page.id] = page
            if page.sha256 and page.sha256 not in self.held.get(lane.pod_id, ()):
                # Now, not when the forward first runs: the next pages of its document, chosen in
                # this same pass, must see this pod as holding it.
                self.start_put(page, lane)
            task = asyncio.ensure_future(self.forward(page, lane))
            self.forwarding[page.id] = task
            self.flights.add(task)
            task.add_done_callback(self.flights.discard)

    def note_no_lane(self) -> None:
        now = time.monotonic()
        if now - self._last_reason_log < REASON_LOG_SECONDS:
            return
        self._last_reason_log = now
        counts = self.lanes.counts
        log.info(
            "pool %s: no pod right now: %s (waiting here %d, in flight %d, booting %d, ready %d, draining %d)",
            self.pool_id, self.lanes.why_none(), len(self.queue), len(self.flights), counts.booting, counts.ready,
            counts.draining,
        )  # fmt: skip

    async def forward(self, page: ClaimedPage, lane: PodLanes) -> None:
        """Send one page to one lane. While it is out, ``self.inflight[page.id]`` is the
        newest claim it stands for, until its outcome is known (``forward_over``)."""
        try:
            self.assignments.append((page.id, page.attempts, lane.pod_id))
            sent = time.monotonic()
            answered = await self.asked(page, lane)
            if answered is None:
                return
            status, body = answered
            self.refusals.pop(lane.pod_id, None)
            if status == 200:
                await self.answer_keep(page, lane, body, seconds=time.monotonic() - sent)
                return
            error = error_of(body)
            if status == 429:
                # The pod is full (another dispatcher shares it): try again soon, no attempt spent.
                await asyncio.sleep(0.2)
                self.hand_back(page)
                return
            failure = status_failure(status, error)
            await self.attempt_failed(page, lane, failure.error, final=failure.final, pod_fault=failure.pod_fault)
        except Exception as exc:
            log.exception("page %s: forward failed", page.id)
            await self.attempt_failed(page, lane, f"dispatch error: {exc!r}")
        finally:
            self.forward_over(page.id, page.attempts)  # if not said already: a newer claim goes back to the queue
            self.lanes.release(lane)
            # The next claimed page takes the lane now, not when the main loop comes round.
            self.start_forwards()
            self.wakeup.set()

    async def asked(self, page: ClaimedPage, lane: PodLanes) -> tuple[int, bytes] | None:
        """The pod's answer (status, body) to ``ask``; None when none came, the page's attempt
        failed or the page handed back (nothing reached the pod) here."""
        blocked_before = self.blocked_seconds()
        try:
            return await self.ask(page, lane)
        except TimeoutError:
            # Not the pod's fault if this loop was itself too late to read the answer.
            excused = self.blocked_seconds() - blocked_before >= BLOCKED_EXCUSES_TIMEOUT_SECONDS
            await self.attempt_failed(page, lane, "the pod did not answer in time", pod_fault=not excused)
        except (aiohttp.ClientConnectorError, PodRefused) as exc:
            # Nothing reached the pod: the page goes to another lane on this claim.
            self.hand_back(page)
            await self.connection_refused(lane, exc)
        except DocumentWaited as exc:
            # Nor here (its document never left): the page goes back, its lane free for another.
            log.info("page %s: %s; back in the queue", page.id, exc)
            self.hand_back(page)
        except AnswerTooLarge as exc:
            await self.attempt_failed(page, lane, str(exc), pod_fault=True)
        except aiohttp.ClientError as exc:
            await self.attempt_failed(page, lane, f"the pod is unreachable: {exc!r}", pod_fault=True)
        except DocumentRefused as exc:
            # 413: too large for this pod's cache; 400: the bytes are not what their hash says.
            final = exc.status in (400, 413)
            await self.attempt_failed(page, lane, f"the pod refused the document: {exc}", final=final,
                                      pod_fault=not final)  # fmt: skip
        return None

    async def answer_keep(self, page: ClaimedPage, lane: PodLanes, body: bytes, *, seconds: float) -> None:
        """A 200's body: the page's answer, parsed once, here (typed from now on), joins the batch
        to store, on the newest claim this loop holds on the page."""
        try:
            answer = PageAnswer.model_validate_json(body)
        except ValidationError as exc:
            await self.attempt_failed(page, lane, f"the pod's answer is not a page's: {_first(exc)}", pod_fault=True)
            return
        lane.failures = 0
        attempt = self.claim_of(page).attempts  # the answer stands for the newest claim
        self.results.append(PageResult(page.id, page.job_id, page.position, lane.pod_id, answer, seconds,
                                       attempt=attempt))  # fmt: skip
        self.forward_over(page.id, attempt)

    async def ask(self, page: ClaimedPage, lane: PodLanes) -> tuple[int, bytes]:
        """Ask the pod for the page by its document's hash, sending the document first if the pod
        does not hold it as far as this loop knows; a 409 (the pod does not hold it: evicted,
        restarted) sends it again and asks again. A 409 is not an attempt."""
        if not page.sha256:  # a document stored before documents had hashes
            page = dataclasses.replace(page, sha256=await self.io(_document_sha256, page.source))
        head, tail = _page_request(page.sha256, settings.OCR_RENDER_DPI, page.languages)
        payload = b"%s%d%s" % (head, page.number, tail)
        for _ in range(DOCUMENT_SENDS):
            await self.send_document(page, lane)
            status, body = await self.pods.post(lane.base_url, "/v1/ocr", payload, token=lane.token)
            if status != 409:
                break
            self.forget(lane.pod_id, page.sha256)
        return status, body

    def blocked_seconds(self) -> float:
        """How long this loop has been blocked so far, as its lag sampler measured it."""
        return self.watch.blocked_s if self.watch is not None else 0.0

    def claim_of(self, page: ClaimedPage) -> ClaimedPage:
        """The newest claim on this page that this dispatcher holds."""
        return self.inflight.get(page.id, page)

    def hand_back(self, page: ClaimedPage) -> None:
        """Put a page that never reached a pod back at the head of the queue, on its newest claim."""
        if self.forwarding.get(page.id) is asyncio.current_task():
            del self.forwarding[page.id]
        self.queue.appendleft(self.inflight.pop(page.id, page))

    def forward_over(self, page_id: int, attempt: int) -> None:
        """This forward's outcome for the page is known (stored as ``attempt``): it no longer holds the
        page, so a claim that comes now gets a forward of its own; and a newer claim that came while the
        outcome was being stored, which the outcome does not answer, goes back to the queue."""
        if self.forwarding.get(page_id) is not asyncio.current_task():
            return  # said already; the page may have a new forward of its own by now
        del self.forwarding[page_id]
        newest = self.inflight.pop(page_id, None)
        if newest is not None and newest.attempts > attempt:
            self.queue.appendleft(newest)

    async def connection_refused(self, lane: PodLanes, exc: Exception) -> None:
        """The pod took no connection: none of its lanes gets a page for a while (the
        forwards already out to it count as one refusal), and the scaler hears of it
        (a dead pod is found lost by its reconcile). A pod that refuses again after
        that is drained: it is not serving."""
        pod_id = lane.pod_id
        now = time.monotonic()
        if self.shunned.get(pod_id, 0) > now:
            return
        refusals = self.refusals[pod_id] = self.refusals.get(pod_id, 0) + 1
        self.shunned[pod_id] = now + REFUSED_SHUN_SECONDS
        self.lanes.remove(pod_id)
        log.warning("pod %s refused a connection (%d time(s) in a row): %r", pod_id, refusals, exc)
        if await self.preempted(pod_id):
            return
        if refusals >= REFUSALS_TO_DRAIN:
            self.refusals.pop(pod_id, None)
            self.drained.add(pod_id)
            await self.db(pod_drain, pod_id=pod_id, error=f"refusing connections {refusals} times: {exc!r}")
        else:
            await self.db(database.nudge_scaler, pool_id=self.pool_id)

    async def attempt_failed(
        self, page: ClaimedPage, lane: PodLanes, error: str, *, final: bool = False, pod_fault: bool = False
    ) -> None:
        claim = self.claim_of(page)
        if lane.token:
            error = error.replace(lane.token, "[pod token]")  # whatever an error repeats, never the token
        outcome = await self.db(page_attempt_failed, page_id=page.id, token=self.token,
                                pod_id=lane.pod_id, error=error, final=final, attempt=claim.attempts)  # fmt: skip
        log.warning("page %s attempt %d on pod %s: %s (%s)", page.id, claim.attempts, lane.pod_id, error, outcome)
        # Before anything else is awaited: the page may be claimed again any moment now.
        self.forward_over(page.id, claim.attempts)
        if outcome == "failed":
            self.failed += 1
            self.touched_jobs.add(page.job_id)
        if pod_fault and await self.preempted(lane.pod_id):
            return
        if pod_fault:
            lane.failures += 1
            if lane.failures >= POD_FAILURES_TO_DRAIN and lane.active:
                self.lanes.remove(lane.pod_id)
                self.drained.add(lane.pod_id)
                await self.db(pod_drain, pod_id=lane.pod_id, error=f"{POD_FAILURES_TO_DRAIN} failed pages: {error}")

    async def preempted(self, pod_id: int) -> bool:
        """Whether the provider preempted this pod (an interruptible one), asked now: then it is
        recorded (its pages wait again, the attempts they spent on it given back), it leaves this
        loop's lanes and the scaler is nudged to replace it. Asked at most every
        PREEMPTION_CHECK_SECONDS per pod; False for any other pod, or when the provider cannot say."""
        now = time.monotonic()
        if self.preemption_checked.get(pod_id, -1e9) > now - PREEMPTION_CHECK_SECONDS:
            return False
        self.preemption_checked[pod_id] = now
        address = await self.db(preemption.pod_address, pod_id=pod_id)
        seen = await self.io(preemption.provider_pod, *address) if address is not None else None
        if seen is None or not await self.db(preemption.pod_preempted_if_stopped, pod_id=pod_id, seen=seen):
            return False
        self.lanes.remove(pod_id)
        self.drained.add(pod_id)
        await self.db(database.nudge_scaler, pool_id=self.pool_id)
        return True

    async def refresh_pods(self) -> None:
        ready, counts = await self.db(database.fleet, pool_id=self.pool_id)
        # A read that began before a drain was stored still lists the pod as ready.
        ready = [pod for pod in ready if pod[0] not in self.drained]
        if self.shunned:
            now = time.monotonic()
            self.shunned = {pod_id: until for pod_id, until in self.shunned.items() if until > now}
            ready = [pod for pod in ready if pod[0] not in self.shunned]
        self.lanes.sync(ready, counts)
        for pod_id in [pod_id for pod_id in self.held if pod_id not in self.lanes.pods]:
            self.forget_pod(pod_id)  # gone, or shunned: a pod back later is asked (and corrects with 409s)

    def in_hand(self) -> set[int]:
        """The pages this loop holds: claimed and waiting for a lane, out at a pod, their results
        not stored yet. Only their claims are renewed: a page it claimed and lost track of (a bug,
        an exception between two of its records) expires and waits again within PAGE_CLAIM_SECONDS."""
        held = {page.id for page in self.queue} | set(self.inflight) | set(self.forwarding)
        return held | {item.page_id for item in self.results} | self.storing

    async def heartbeat(self) -> None:
        busy_pods = [lane.pod_id for lane in self.lanes.pods.values() if lane.inflight]
        note = self.lanes.why_none() if self.queue and not self.lanes.free else ""
        now = time.monotonic()
        if note and now - self._last_nudge >= SCALER_NUDGE_SECONDS:
            # Pages wait for lanes: the scaler hears it within seconds, not at its next schedule.
            self._last_nudge = now
            await self.db(database.nudge_scaler, pool_id=self.pool_id)
        queued = list(self.queue)
        held = await self.db(database.beat, dispatcher_id=self.dispatcher.pk, token=self.token,
                             page_ids=sorted(self.in_hand()), renew_within=renew_within(), busy_pods=busy_pods,
                             note=note, done=self.done, failed=self.failed)  # fmt: skip
        self.drop_lost(queued, held)
        await self.refresh_jobs()

    def drop_lost(self, queued: list[ClaimedPage], held: set[int]) -> None:
        """Pages waiting here for a lane whose claims this loop no longer holds (their job was
        cancelled; or they expired and went elsewhere) are never sent. A page already out at a pod
        finishes there: the pod is paid for and busy with it either way, and its result is refused."""
        lost = {page for page in queued if page.id not in held}
        if lost:
            self.queue = PageQueue(page for page in self.queue if page not in lost)
            log.info("dispatcher %s: %d pages waiting for a lane are no longer ours (job cancelled?), not sent",
                     self.dispatcher.pk, len(lost))  # fmt: skip
        self.affinity_waits = {sha: t for sha, t in self.affinity_waits.items() if self.queue.queued(sha)}

    async def refresh_jobs(self) -> None:
        jobs, self.touched_jobs = self.touched_jobs, set()
        if jobs:
            await self.db(jobs_refresh, job_ids=jobs)


@functools.lru_cache(maxsize=1024)
def _page_request(sha256: str, dpi: int, languages: str) -> tuple[bytes, bytes]:
    """A page's ``POST /v1/ocr`` body around its number, made once per document: json.dumps of each
    page's was 3% of the loop's CPU at 64 pods x 8 lanes."""
    body = json.dumps({"document": sha256, "page": 0, "dpi": dpi, "languages": languages})
    head, _, tail = body.partition('"page": 0')  # a hash is hex and comes first: the one such text
    return f'{head}"page": '.encode(), tail.encode()


def renew_within() -> float:
    """Seconds within which a claim's expiry makes a beat renew it: half the claim's time, and no
    less than ``RENEW_BEATS`` beats' time (a loop that beats late still renews it in time)."""
    return max(settings.PAGE_CLAIM_SECONDS / 2, RENEW_BEATS * HEARTBEAT_SECONDS)


def _first(error: ValidationError) -> str:
    """A malformed answer's first fault, short: where, and what (never the value: it may be long)."""
    first = error.errors(include_url=False, include_input=False)[0]
    return f"{'.'.join(map(str, first['loc'])) or 'the answer'}: {first['msg']}"


def _document_sha256(source: str) -> str:
    return hashlib.sha256(document_bytes(source)).hexdigest()


async def _watched(loop: DispatchLoop, *, name: str) -> None:
    """Run the dispatch loop with its loop-lag sampler (invariant 3)."""
    async with LoopWatch(name=name, kind="dispatcher") as watch:
        loop.watch = watch
        await loop.run()


def run_dispatcher(*, pool_id: int) -> Dispatcher | None:
    """Entry point for the worker task: register, run the loop, end."""
    dispatcher = dispatcher_register(pool_id=pool_id)
    if dispatcher is None:
        return None
    loop = DispatchLoop(dispatcher)
    asyncio.run(_watched(loop, name=f"dispatcher pool {dispatcher.pool.key}"))
    if loop.hit_time_limit and pages_waiting(pool_id=pool_id):
        # A successor takes over; one that left for want of pods is started again by the next pod ready.
        dispatch_ensure(pool=dispatcher.pool)
    return dispatcher
