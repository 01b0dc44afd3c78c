"""A dispatcher: one asyncio loop with many page forwards in flight.

It claims pages (with a lease that it renews), leases a lane on a ready pod,
forwards the page image over HTTP, stores the result once, frees the lane, and
ends when the pool's backlog is empty. Database work runs on one thread of its
own, never on the loop and never on the default executor.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor

import httpx
from django.conf import settings
from django.db import close_old_connections, connection
from django.utils import timezone

from ocrjobs import services
from ocrjobs.dispatch.lanes import FleetCounts, LaneTable, PodLanes
from ocrjobs.models import Dispatcher
from pods.models import Pod

log = logging.getLogger(__name__)

POD_REFRESH_SECONDS = 1.0
HEARTBEAT_SECONDS = 2.0
JOB_REFRESH_SECONDS = 0.5
REASON_LOG_SECONDS = 15.0
IDLE_EXIT_SECONDS = 3.0
NO_POD_EXIT_SECONDS = 30.0
POD_FAILURES_TO_DRAIN = 5


class DispatchLoop:
    def __init__(self, dispatcher: Dispatcher):
        self.dispatcher = dispatcher
        self.pool_id = dispatcher.pool_id
        self.token = dispatcher.token
        self.lanes = LaneTable()
        self.queue: deque[services.ClaimedPage] = deque()
        self.flights: set[asyncio.Task] = set()
        self.inflight: dict[int, services.ClaimedPage] = {}
        self.touched_jobs: set[int] = set()
        self.done = 0
        self.failed = 0
        self._db = ThreadPoolExecutor(1, thread_name_prefix="dispatch-db")
        self._io = ThreadPoolExecutor(4, thread_name_prefix="dispatch-io")
        self._last_reason_log = -REASON_LOG_SECONDS
        self.hit_time_limit = False

    async def db(self, fn, /, **kwargs):
        """Run a database call on the loop's own database thread."""
        context = contextvars.copy_context()
        call = functools.partial(context.run, fn, **kwargs)
        return await asyncio.get_running_loop().run_in_executor(self._db, call)

    async def io(self, fn, /, *args):
        return await asyncio.get_running_loop().run_in_executor(self._io, fn, *args)

    async def run(self) -> None:
        started = time.monotonic()
        deadline = started + settings.DISPATCH_MAX_SECONDS
        timeout = httpx.Timeout(settings.PAGE_TIMEOUT_SECONDS + 10, connect=5.0)
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=1024)
        last_refresh = last_beat = last_jobs = -1e9
        idle_since: float | None = None
        no_pod_since: float | None = None
        try:
            async with httpx.AsyncClient(timeout=timeout, limits=limits) as self.client:
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
                    want = self.lanes.free - len(self.queue)
                    if want > 0 and not stopping:
                        claimed = await self.db(services.pages_claim, pool_id=self.pool_id, token=self.token,
                                                limit=want)  # fmt: skip
                        self.queue.extend(claimed)
                    self.start_forwards()
                    if self.queue and not self.lanes.free:
                        self.note_no_lane()
                    if self.lanes.total == 0:
                        no_pod_since = no_pod_since or now
                    else:
                        no_pod_since = None
                    if not self.flights and not self.queue:
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
                    if self.flights:
                        await asyncio.wait(self.flights, timeout=0.25, return_when=asyncio.FIRST_COMPLETED)
                    else:
                        await asyncio.sleep(0.25)
        finally:
            if self.queue:
                await self.db(services.pages_unclaim, token=self.token, page_ids=[p.id for p in self.queue])
                self.queue.clear()
            await self.refresh_jobs()
            await self.db(services.dispatcher_end, dispatcher=self.dispatcher)
            await self.db(_save_counts, dispatcher_id=self.dispatcher.pk, done=self.done, failed=self.failed)
            await self.db(_close_connection)
            self._db.shutdown(wait=True)
            self._io.shutdown(wait=True)
        log.info("dispatcher %s ended: %d pages done, %d failed in %.1f s", self.dispatcher.pk, self.done,
                 self.failed, time.monotonic() - started)  # fmt: skip

    async def try_finish(self) -> bool:
        """End when no page waits; ending first, then looking again, closes the gap
        in which a page submitted now would find a dispatcher that is leaving."""
        if await self.db(services.pages_waiting, pool_id=self.pool_id):
            return False
        await self.db(services.dispatcher_end, dispatcher=self.dispatcher)
        if not await self.db(services.pages_waiting, pool_id=self.pool_id):
            return True
        await self.db(_revive, dispatcher_id=self.dispatcher.pk)
        return False

    def start_forwards(self) -> None:
        while self.queue:
            lane = self.lanes.lease()
            if lane is None:
                return
            page = self.queue.popleft()
            self.inflight[page.id] = page
            task = asyncio.ensure_future(self.forward(page, lane))
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

    async def forward(self, page: services.ClaimedPage, lane: PodLanes) -> None:
        try:
            await self.db(services.page_assign_pod, page_id=page.id, token=self.token, pod_id=lane.pod_id)
            image = await self.io(_read_bytes, page.image)
            try:
                response = await self.client.post(
                    f"{lane.base_url}/v1/ocr", params={"lang": page.languages}, content=image
                )
            except httpx.TimeoutException:
                await self.attempt_failed(page, lane, "the pod did not answer in time", pod_fault=True)
                return
            except httpx.TransportError as exc:
                await self.attempt_failed(page, lane, f"the pod is unreachable: {exc!r}", pod_fault=True)
                return
            if response.status_code == 200:
                lane.failures = 0
                stored = await self.db(services.page_complete, page_id=page.id, token=self.token,
                                       pod_id=lane.pod_id, result=response.json())  # fmt: skip
                if stored:
                    self.done += 1
                    self.touched_jobs.add(page.job_id)
                return
            error = _error_of(response)
            if response.status_code == 429:
                # The pod is full (another dispatcher shares it): try again soon, no attempt spent.
                self.queue.appendleft(page)
                self.inflight.pop(page.id, None)
                await asyncio.sleep(0.2)
                return
            if response.status_code in (400, 413, 415):
                await self.attempt_failed(page, lane, f"the pod refused the page: {error}", final=True)
            elif response.status_code == 504:
                await self.attempt_failed(page, lane, error)
            else:
                await self.attempt_failed(page, lane, f"HTTP {response.status_code}: {error}", pod_fault=True)
        except Exception as exc:
            log.exception("page %s: forward failed", page.id)
            await self.attempt_failed(page, lane, f"dispatch error: {exc!r}")
        finally:
            self.inflight.pop(page.id, None)
            self.lanes.release(lane)

    async def attempt_failed(
        self, page: services.ClaimedPage, lane: PodLanes, error: str, *, final: bool = False, pod_fault: bool = False
    ) -> None:
        outcome = await self.db(services.page_attempt_failed, page_id=page.id, token=self.token,
                                pod_id=lane.pod_id, error=error, final=final)  # fmt: skip
        log.warning("page %s attempt %d on pod %s: %s (%s)", page.id, page.attempts, lane.pod_id, error, outcome)
        if outcome == "failed":
            self.failed += 1
            self.touched_jobs.add(page.job_id)
        if pod_fault:
            lane.failures += 1
            if lane.failures >= POD_FAILURES_TO_DRAIN and lane.active:
                self.lanes.remove(lane.pod_id)
                await self.db(_drain_pod, pod_id=lane.pod_id, error=error)

    async def refresh_pods(self) -> None:
        ready, counts = await self.db(_fleet, pool_id=self.pool_id)
        self.lanes.sync(ready, counts)

    async def heartbeat(self) -> None:
        page_ids = list(self.inflight) + [p.id for p in self.queue]
        busy_pods = [lane.pod_id for lane in self.lanes.pods.values() if lane.inflight]
        note = self.lanes.why_none() if self.queue and not self.lanes.free else ""
        await self.db(_beat, dispatcher_id=self.dispatcher.pk, token=self.token, page_ids=page_ids,
                      busy_pods=busy_pods, note=note, done=self.done, failed=self.failed)  # fmt: skip
        await self.refresh_jobs()

    async def refresh_jobs(self) -> None:
        jobs, self.touched_jobs = self.touched_jobs, set()
        for job_id in jobs:
            await self.db(services.job_refresh, job_id=job_id)


def _close_connection() -> None:
    connection.close()  # the database thread's own connection


def _read_bytes(relative: str) -> bytes:
    return (settings.MEDIA_ROOT / relative).read_bytes()


def _error_of(response: httpx.Response) -> str:
    try:
        return str(response.json().get("error") or response.text[:200])
    except ValueError:
        return response.text[:200]


def _fleet(*, pool_id: int) -> tuple[list[tuple[int, str, int]], FleetCounts]:
    close_old_connections()
    pods = list(Pod.objects.alive().filter(pool_id=pool_id).values_list("pk", "state", "base_url", "lanes"))
    ready = [(pk, url, lanes) for pk, state, url, lanes in pods if state == Pod.State.READY]
    counts = FleetCounts(
        booting=sum(1 for p in pods if p[1] == Pod.State.BOOTING),
        ready=len(ready),
        draining=sum(1 for p in pods if p[1] == Pod.State.DRAINING),
    )
    return ready, counts


def _beat(*, dispatcher_id: int, token: str, page_ids: list[int], busy_pods: list[int], note: str, done: int,
          failed: int) -> None:  # fmt: skip
    now = timezone.now()
    Dispatcher.objects.filter(pk=dispatcher_id).update(heartbeat_at=now, note=note[:200], pages_done=done,
                                                       pages_failed=failed)  # fmt: skip
    if page_ids:
        services.claims_renew(token=token, page_ids=page_ids)
    if busy_pods:
        Pod.objects.filter(pk__in=busy_pods).update(last_busy_at=now)


def _save_counts(*, dispatcher_id: int, done: int, failed: int) -> None:
    Dispatcher.objects.filter(pk=dispatcher_id).update(pages_done=done, pages_failed=failed)


def _revive(*, dispatcher_id: int) -> None:
    Dispatcher.objects.filter(pk=dispatcher_id).update(ended_at=None, heartbeat_at=timezone.now())


def _drain_pod(*, pod_id: int, error: str) -> None:
    updated = Pod.objects.filter(pk=pod_id, state=Pod.State.READY).update(
        state=Pod.State.DRAINING, error=f"drained after {POD_FAILURES_TO_DRAIN} failed pages: {error}"[:2000]
    )
    if updated:
        log.warning("pod %s drained after %d failed pages", pod_id, POD_FAILURES_TO_DRAIN)
        from pods.tasks import nudge_scaler

        nudge_scaler(Pod.objects.get(pk=pod_id).pool_id)


def run_dispatcher(*, pool_id: int) -> Dispatcher | None:
    """Entry point for the worker task: register, run the loop, end."""
    dispatcher = services.dispatcher_register(pool_id=pool_id)
    if dispatcher is None:
        return None
    loop = DispatchLoop(dispatcher)
    asyncio.run(loop.run())
    if loop.hit_time_limit and services.pages_waiting(pool_id=pool_id):
        # A successor takes over; one that left for want of pods is started again by the next pod ready.
        services.dispatch_ensure(pool=dispatcher.pool)
    return dispatcher
