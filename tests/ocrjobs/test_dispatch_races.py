"""The dispatch loop's bookkeeping of pages out at pods, at the moments its database calls leave
room for other coroutines (ocrjobs/dispatch/loop.py). The database and the pods are stand-ins
that the test steps by hand, so each race happens every time."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from ocrjobs.dispatch import database
from ocrjobs.dispatch import loop as dispatch
from ocrjobs.dispatch.lanes import FleetCounts
from ocrjobs.services.pages import ClaimedPage, PageResult, page_attempt_failed
from podserver.answers import PageAnswer

GUARD = 10  # seconds, against hangs only


class Stored:
    """A document PUT that the pod took."""

    async def __aenter__(self):
        parts = [b'{"pages": 1}', b""]  # read as aiohttp's body is, a chunk at a time, then b"" at its end
        return SimpleNamespace(status=201, content_length=None, content=SimpleNamespace(readany=self._next(parts)))

    async def __aexit__(self, *exc):
        return False

    @staticmethod
    def _next(parts):
        async def readany():
            return parts.pop(0)

        return readany


class FailingPod:
    """Every document is taken (aiohttp's ``put``), every page posted (PodPages's ``post``) gets
    HTTP 500: a fault of the pod. Remembers where pages were sent."""

    def __init__(self):
        self.posted: list[str] = []

    def put(self, url, data, headers=None):
        return Stored()

    async def post(self, base_url, path, body, *, token=""):
        self.posted.append(base_url)
        return 500, b'{"error": "engine crashed"}'


def dispatch_loop(drain_started: asyncio.Event, drain_may_end: asyncio.Event) -> dispatch.DispatchLoop:
    loop = dispatch.DispatchLoop(SimpleNamespace(pool_id=1, token="t", pk=1))
    loop.client = loop.pods = FailingPod()

    async def io(fn, *args):
        return b"png", None  # a document's body read whole, no file to close (document_body)

    async def db(fn, /, **kwargs):
        if fn is page_attempt_failed:
            return "retry"  # the page waits again, claimable by the next claim
        if fn is dispatch.pod_drain:
            drain_started.set()
            await drain_may_end.wait()  # a slow drain: other coroutines run meanwhile
        return None

    loop.io, loop.db = io, db
    loop.wakeup = asyncio.Event()  # run() makes it; nobody waits on it here
    loop.lanes.sync([(7, "http://pod-7", 1, ""), (8, "http://pod-8", 1, "")], FleetCounts(ready=2))
    return loop


def page(attempts: int) -> ClaimedPage:
    return ClaimedPage(
        id=41,
        job_id=1,
        position=0,
        document_id=1,
        source="p.png",
        sha256="a" * 64,
        number=1,
        languages="eng",
        attempts=attempts,
    )


def test_a_page_claimed_again_while_its_failed_forward_drains_the_pod_gets_a_forward_of_its_own():
    async def scenario():
        drain_started, drain_may_end = asyncio.Event(), asyncio.Event()
        loop = dispatch_loop(drain_started, drain_may_end)
        loop.lanes.pods[7].failures = dispatch.POD_FAILURES_TO_DRAIN - 1  # this failure drains pod 7
        loop.lanes.pods[8].active = True
        loop.lanes.remove(8)  # the first attempt can only go to pod 7

        loop.queue.append(page(attempts=1))
        loop.start_forwards()
        await asyncio.wait_for(drain_started.wait(), GUARD)  # attempt 1 failed, stored as "retry"; pod 7 drains

        # Meanwhile the page is claimed again (attempt 2), and a lane on pod 8 is free.
        loop.lanes.sync([(8, "http://pod-8", 1, "")], FleetCounts(ready=1))
        loop.queue.append(page(attempts=2))
        loop.start_forwards()

        drain_may_end.set()
        await asyncio.wait_for(asyncio.gather(*loop.flights), GUARD)
        return loop

    loop = asyncio.run(scenario())

    # Before: the claim was taken for one the failed forward stood for, and was dropped with it.
    assert loop.client.posted == ["http://pod-7", "http://pod-8"], "attempt 2 was never sent"


def test_a_newer_claim_the_failed_outcome_does_not_answer_goes_back_to_the_queue():
    async def scenario():
        drain_started, drain_may_end = asyncio.Event(), asyncio.Event()
        loop = dispatch_loop(drain_started, drain_may_end)
        stored = asyncio.Event()
        proceed = asyncio.Event()
        plain_db = loop.db

        async def db(fn, /, **kwargs):
            if fn is page_attempt_failed:
                stored.set()
                await proceed.wait()  # while attempt 1's failure is being stored...
            return await plain_db(fn, **kwargs)

        loop.db = db
        loop.queue.append(page(attempts=1))
        loop.start_forwards()
        [forward] = loop.flights
        await asyncio.wait_for(stored.wait(), GUARD)
        # ...the pod is declared lost elsewhere and the page claimed again: that forward stands for it
        loop.queue.append(page(attempts=2))
        loop.start_forwards()
        assert loop.flights == {forward} and loop.inflight[41].attempts == 2
        loop.lanes.remove(8)  # no lane: whatever is handed back stays in the queue to be seen
        loop.lanes.remove(7)
        proceed.set()
        await asyncio.wait_for(forward, GUARD)
        return loop

    loop = asyncio.run(scenario())

    # The failure was stored for attempt 1; attempt 2 was never sent anywhere, so it waits again.
    assert [p.attempts for p in loop.queue] == [2]
    assert 41 not in loop.inflight


def test_a_pod_this_loop_drained_is_not_brought_back_by_a_read_from_before_the_drain():
    async def scenario():
        loop = dispatch_loop(asyncio.Event(), asyncio.Event())
        loop.drained.add(7)

        async def db(fn, /, **kwargs):
            assert fn is database.fleet
            return [(7, "http://pod-7", 1, ""), (8, "http://pod-8", 1, "")], FleetCounts(ready=2)

        loop.db = db
        loop.lanes.remove(7)
        await loop.refresh_pods()
        return loop

    loop = asyncio.run(scenario())
    assert set(loop.lanes.pods) == {8}


def test_a_flush_stores_results_and_the_other_pages_pods_in_one_trip_without_their_assignments():
    loop = dispatch.DispatchLoop(SimpleNamespace(pool_id=1, token="t", pk=1))
    trips = []

    async def db(fn, /, **kwargs):
        trips.append((fn, kwargs))
        return {item.page_id for item in kwargs["results"]}

    loop.db, loop.wakeup = db, asyncio.Event()
    loop.assignments = [(1, 1, 7), (2, 1, 7), (3, 2, 8)]
    answered = PageResult(1, 10, 0, 7, PageAnswer(text="x"), 0.1, attempt=1)
    older = PageResult(3, 10, 0, 8, PageAnswer(text="y"), 0.1, attempt=1)  # an older attempt's answer
    loop.results = [answered, older]

    asyncio.run(loop.flush())

    assert trips == [
        (database.store, {"token": "t", "assignments": [(2, 1, 7), (3, 2, 8)], "results": [answered, older]})
    ]
    assert loop.done == 2 and loop.touched_jobs == {10} and loop.assignments == loop.results == []
