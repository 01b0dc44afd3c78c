"""Documents travel, not pixels (invariant 16): the dispatcher sends a page's document to a pod at
most once while the pod keeps it, as its own bytes, asks for the page by the document's hash, sends
it again when the pod answers 409, and prefers lanes on pods that already hold the document."""

from __future__ import annotations

import asyncio
import hashlib
from types import SimpleNamespace

import pytest

from ocrjobs.dispatch import documents, sending
from ocrjobs.dispatch import loop as dispatch
from ocrjobs.dispatch.lanes import FleetCounts
from ocrjobs.dispatch.queue import PageQueue
from ocrjobs.dispatch.sending import FileBody, document_body
from ocrjobs.models import Job, Page
from ocrjobs.services.dispatchers import dispatcher_register
from ocrjobs.services.pages import ClaimedPage
from tests.factories import PAGES_TRUTH, image_bytes, pdf_bytes
from tests.ocrjobs.helpers import run_dispatch_loop, split, submit, tiff_bytes


def test_a_document_crosses_to_its_pod_once_however_many_of_its_pages_go_there(sim_pool, ordinary_user):
    # Two lanes: the first two pages of each PDF go out together and share one PUT.
    first, second = pdf_bytes(PAGES_TRUTH * 2), pdf_bytes(PAGES_TRUTH[:2])
    job = submit(ordinary_user, {"a.pdf": first, "b.pdf": second}, pool_key=sim_pool.pool.key)
    split(job)

    loop = run_dispatch_loop(sim_pool.pool)

    stats = sim_pool.sim.stats()
    assert set(job.pages.values_list("status", flat=True)) == {Page.Status.DONE}
    assert stats["ocr_pages"] == 8
    assert (stats["documents_received"], stats["documents_already_cached"]) == (2, 0)
    assert stats["document_bytes_received"] == len(first) + len(second)
    assert stats["image_bytes_received"] == 0  # no page was sent as an image
    assert (loop.documents_sent, loop.bytes_sent) == (2, len(first) + len(second))
    assert Job.objects.get(pk=job.pk).status == Job.Status.DONE


def test_a_document_on_this_hosts_disk_goes_to_the_pod_by_sendfile(sim_pool, ordinary_user, monkeypatch):
    sent = []
    sendfile = asyncio.BaseEventLoop.sendfile

    async def counted(self, transport, file, offset=0, count=None, **kwargs):
        sent.append(count)
        return await sendfile(self, transport, file, offset, count, **kwargs)

    monkeypatch.setattr(asyncio.BaseEventLoop, "sendfile", counted)
    first, second = pdf_bytes(PAGES_TRUTH[:2]), image_bytes(["b"])
    job = submit(ordinary_user, {"a.pdf": first, "b.png": second}, pool_key=sim_pool.pool.key)
    split(job)

    loop = run_dispatch_loop(sim_pool.pool)

    # The kernel sent them, not read into memory; the pod checked each body against its hash.
    assert sorted(sent) == sorted([len(first), len(second)])
    assert set(job.pages.values_list("status", flat=True)) == {Page.Status.DONE}
    assert sim_pool.sim.stats()["document_bytes_received"] == len(first) + len(second) == loop.bytes_sent


def test_a_document_for_a_tls_connection_is_read_whole(ordinary_user):
    content = image_bytes(["b"])
    job = submit(ordinary_user, {"b.png": content})
    source = job.documents.get().source

    assert document_body(source, sendfile=False) == (content, None)
    body, file = document_body(source)
    with file:
        assert isinstance(body, FileBody) and body.size == len(content)


def test_images_go_to_the_pod_as_their_own_bytes(sim_pool, ordinary_user):
    files = {
        "scan.png": image_bytes(["a png"], "PNG"),
        "photo.jpg": image_bytes(["a jpeg"], "JPEG"),
        "fax.tif": tiff_bytes([(120, 80), (90, 60)]),
    }
    job = submit(ordinary_user, files, pool_key=sim_pool.pool.key)
    split(job)

    run_dispatch_loop(sim_pool.pool)

    held = {d["sha256"]: d for d in sim_pool.sim.pod_documents(sim_pool.pod.provider_id)}
    # The pod checks each body against its hash: these are the uploads, byte for byte.
    assert set(held) == {hashlib.sha256(data).hexdigest() for data in files.values()}
    assert sorted(d["bytes"] for d in held.values()) == sorted(len(data) for data in files.values())
    assert set(job.pages.values_list("status", flat=True)) == {Page.Status.DONE}
    assert job.pages.count() == 4  # the TIFF's two frames are pages 1 and 2 of one document
    assert sim_pool.sim.stats()["documents_received"] == 3


def test_a_pod_that_answers_409_gets_the_document_again_and_the_page_spends_no_attempt(sim_pool, ordinary_user):
    content = pdf_bytes(PAGES_TRUTH[:1])
    job = submit(ordinary_user, {"a.pdf": content}, pool_key=sim_pool.pool.key)
    split(job)
    sha256 = job.documents.get().sha256

    dispatcher = dispatcher_register(pool_id=sim_pool.pool.pk)
    loop = dispatch.DispatchLoop(dispatcher)
    # As if this loop had sent it earlier and the pod had evicted it since (or restarted).
    loop.remember(sim_pool.pod.pk, sha256)
    asyncio.run(dispatch._watched(loop, name="test"))

    stats = sim_pool.sim.stats()
    page = job.pages.get()
    assert (page.status, page.attempts, page.error) == (Page.Status.DONE, 1, "")
    assert stats["ocr_not_cached_answers"] == 1
    assert stats["documents_received"] == 1
    assert stats["ocr_pages"] == 1


# --- affinity: which lane a page takes (the loop's choice alone, no pod) ---------------------------


def sha(document: str) -> str:
    """The sha256 of a test's document: "a" * 64 for "a", a hash of a longer name."""
    return document * 64 if len(document) == 1 else hashlib.sha256(document.encode()).hexdigest()


def claimed(page_id: int, document: str, pages: int = 4, size: int = 0) -> ClaimedPage:
    return ClaimedPage(id=page_id, job_id=1, position=0, document_id=1, source="d", sha256=sha(document),
                       number=page_id, languages="eng", attempts=1, pages=pages, size=size)  # fmt: skip


@pytest.fixture
def two_pods() -> dispatch.DispatchLoop:
    loop = dispatch.DispatchLoop(SimpleNamespace(pool_id=1, token="t", pk=1))
    loop.lanes.sync([(1, "http://pod-1", 1, ""), (2, "http://pod-2", 1, "")], FleetCounts(ready=2))
    return loop


def test_a_page_goes_to_the_pod_that_holds_its_document_when_both_are_free(two_pods):
    loop = two_pods
    loop.remember(2, "b" * 64)
    loop.queue.extend([claimed(1, "b")])

    page, lane = loop.next_forward()

    assert (page.id, lane.pod_id) == (1, 2)


def test_a_page_whose_documents_pod_is_busy_lets_a_page_of_a_new_document_go_first(two_pods):
    loop = two_pods
    loop.remember(1, "a" * 64)
    busy = loop.lanes.lease([1], anywhere=False)
    assert busy.pod_id == 1
    loop.queue.extend([claimed(1, "a"), claimed(2, "c")])

    page, lane = loop.next_forward()

    # Page 1 waits for pod 1 rather than send its document to pod 2 as well.
    assert (page.id, lane.pod_id) == (2, 2)
    assert [p.id for p in loop.queue] == [1]


def test_with_nothing_else_to_send_a_page_waits_for_its_documents_pod_then_takes_any_free_lane(two_pods, monkeypatch):
    loop = two_pods
    loop.remember(1, "a" * 64)
    loop.lanes.lease([1], anywhere=False)
    loop.queue.extend([claimed(1, "a")])
    clock = [100.0]
    monkeypatch.setattr(dispatch.time, "monotonic", lambda: clock[0])

    assert loop.next_forward() == (None, None)  # pod 1 may free a lane any moment
    clock[0] += documents.AFFINITY_WAIT_SECONDS
    page, lane = loop.next_forward()

    assert (page.id, lane.pod_id) == (1, 2)  # no lane left idle for longer: the document crosses again
    assert not loop.queue and not loop.affinity_waits


def test_no_free_lane_takes_no_page(two_pods):
    loop = two_pods
    loop.lanes.lease()
    loop.lanes.lease()
    loop.queue.extend([claimed(1, "a")])

    assert loop.next_forward() == (None, None)
    assert len(loop.queue) == 1


def test_pages_of_one_document_sent_in_one_pass_go_to_the_pod_that_gets_it_and_share_its_put(two_pods):
    loop = two_pods
    loop.lanes.sync([(1, "http://pod-1", 4, ""), (2, "http://pod-2", 4, "")], FleetCounts(ready=2))
    sent: list[tuple[int, int]] = []
    puts: list[int] = []

    async def forward(page, lane):
        sent.append((page.id, lane.pod_id))

    async def put_document(page, lane):
        puts.append(lane.pod_id)

    loop.forward, loop.put_document = forward, put_document

    async def one_pass():
        loop.queue.extend([claimed(n, "a") for n in range(1, 5)])
        loop.start_forwards()  # every page chosen before any forward runs
        await asyncio.sleep(0)

    asyncio.run(one_pass())

    assert len({pod for _, pod in sent}) == 1 and len(sent) == 4
    assert puts == [sent[0][1]]


def test_a_long_document_whose_pod_is_busy_spreads_to_a_free_pod_at_once(two_pods):
    loop = two_pods
    loop.remember(1, "a" * 64)
    loop.lanes.lease([1], anywhere=False)
    loop.queue.extend([claimed(1, "a", pages=documents.AFFINITY_SPREAD_PAGES * 2)])

    page, lane = loop.next_forward()

    # Pages enough to pay for a second copy: pod 2 takes one now, rather than idle.
    assert (page.id, lane.pod_id) == (1, 2)


def test_many_short_documents_with_the_same_bytes_spread_to_a_free_pod_that_does_not_hold_them(two_pods):
    loop = two_pods
    loop.remember(1, "a" * 64)
    loop.lanes.lease([1], anywhere=False)
    # Each document is short, but they share their bytes: one copy on a pod, pages enough for two.
    loop.queue.extend([claimed(n, "a", pages=4) for n in range(1, documents.AFFINITY_SPREAD_PAGES * 2 + 1)])

    page, lane = loop.next_forward()

    assert (page.id, lane.pod_id) == (1, 2)
    assert loop.queue.queued("a" * 64) == documents.AFFINITY_SPREAD_PAGES * 2 - 1


def test_same_bytes_pages_past_what_their_busy_pods_can_start_spread_to_a_pod_that_holds_nothing():
    # bench/storm.py's default mode (issue 21, cause C): every page shares one document's bytes,
    # four pods of four lanes hold it and are busy, two pods that came later hold nothing. The
    # queue (about twice the loop's lanes) never shows AFFINITY_SPREAD_PAGES pages per holder, and
    # a holder lane frees every few milliseconds: the later pods read nothing and were shed idle.
    loop = dispatch.DispatchLoop(SimpleNamespace(pool_id=1, token="t", pk=1))
    loop.lanes.sync([(pod, f"http://pod-{pod}", 4, "") for pod in range(1, 7)], FleetCounts(ready=6))
    for pod in range(1, 5):
        loop.remember(pod, "a" * 64)
        for _ in range(4):
            assert loop.lanes.lease([pod], anywhere=False).pod_id == pod
    queued = 2 * loop.lanes.total  # 48: what the loop's queue holds
    loop.queue.extend([claimed(n, "a", pages=4) for n in range(1, queued + 1)])

    page, lane = loop.next_forward()

    assert page.id == 1 and lane.pod_id in (5, 6)


def test_same_bytes_pages_within_what_their_busy_pods_take_next_wait_for_them(two_pods, monkeypatch):
    loop = two_pods
    loop.remember(1, "a" * 64)
    loop.lanes.lease([1], anywhere=False)
    # A handful of pages over the holder's one lane: not enough to pay for a second copy.
    loop.queue.extend([claimed(n, "a", pages=4) for n in range(1, 5)])
    monkeypatch.setattr(dispatch.time, "monotonic", lambda: 100.0)

    assert loop.next_forward() == (None, None)


def test_pages_of_bytes_every_pod_holds_go_round_all_of_them_not_the_first_few():
    # bench/storm.py's default mode (issue 21): six pods hold the one document every page names.
    # A lease looks at only the first few holders (PREFERRED_LOOKS); when those were always the
    # same four, the lane they freed took the next page, and pods 5 and 6 read nothing again and
    # were shed idle while thousands of pages waited.
    loop = dispatch.DispatchLoop(SimpleNamespace(pool_id=1, token="t", pk=1))
    loop.lanes.sync([(pod, f"http://pod-{pod}", 1, "") for pod in range(1, 7)], FleetCounts(ready=6))
    for pod in range(1, 7):
        loop.remember(pod, "a" * 64)
    loop.queue.extend([claimed(n, "a", pages=4) for n in range(1, 13)])
    served = []
    for _ in range(12):
        page, lane = loop.next_forward()
        served.append(lane.pod_id)
        loop.lanes.release(lane)  # its page is done at once: the lane it frees is the first free

    assert sorted(set(served)) == [1, 2, 3, 4, 5, 6]
    assert max(served.count(pod) for pod in range(1, 7)) == 2


def test_a_pod_that_came_late_gets_pages_when_its_documents_pods_keep_freeing_lanes(monkeypatch):
    # bench/storm.py after a preemption: five pods of four lanes hold the one document every page
    # names, a sixth (the replacement) holds nothing. A holder lane frees every 25 ms and takes the
    # first page, so the first page is a new one each time: when the wait was the first page's, it
    # began again each time, never ended, and the sixth pod read nothing until it was shed idle.
    loop = dispatch.DispatchLoop(SimpleNamespace(pool_id=1, token="t", pk=1))
    loop.lanes.sync([(pod, f"http://pod-{pod}", 4, "") for pod in range(1, 7)], FleetCounts(ready=6))
    busy = []
    for pod in range(1, 6):
        loop.remember(pod, "a" * 64)
        busy += [loop.lanes.lease([pod], anywhere=False) for _ in range(4)]
    loop.queue.extend([claimed(n, "a", pages=4) for n in range(1, 29)])  # free + total: what the loop holds
    clock = [100.0]
    monkeypatch.setattr(dispatch.time, "monotonic", lambda: clock[0])

    served = []
    for turn in range(2 * round(documents.AFFINITY_WAIT_SECONDS / 0.025)):
        clock[0] += 0.025
        loop.lanes.release(busy.pop(0))  # a holder's page is done
        loop.queue.append(claimed(100 + turn, "a", pages=4))  # and the loop claims the next
        page, lane = loop.next_forward()
        while lane is not None:
            served.append((turn, lane.pod_id))
            if lane.pod_id != 6:
                busy.append(lane)
            page, lane = loop.next_forward()

    late = [turn for turn, pod in served if pod == 6]
    assert late, "the late pod was never given a page"
    assert late[0] * 0.025 <= documents.AFFINITY_WAIT_SECONDS + 0.05  # within the wait, not never


def test_a_documents_wait_for_its_pods_ends_when_no_lane_is_free(two_pods, monkeypatch):
    loop = two_pods
    loop.remember(1, "a" * 64)
    held = loop.lanes.lease([1], anywhere=False)
    loop.queue.extend([claimed(1, "a")])
    clock = [100.0]
    monkeypatch.setattr(dispatch.time, "monotonic", lambda: clock[0])
    assert loop.next_forward() == (None, None)  # waits for pod 1; pod 2's lane idles
    other = loop.lanes.lease()  # pod 2 busy too (another document): nothing idles any more
    assert loop.next_forward() == (None, None) and not loop.affinity_waits

    clock[0] += documents.AFFINITY_WAIT_SECONDS
    loop.lanes.release(other)  # pod 2 free again: the wait begins now, not when it first began
    assert loop.next_forward() == (None, None)
    clock[0] += documents.AFFINITY_WAIT_SECONDS
    page, lane = loop.next_forward()
    assert (page.id, lane.pod_id) == (1, 2)
    assert held.pod_id == 1


# --- many documents queued: the look at the queue is by document, not by page --------------------


def many_pods(pods: int, lanes: int) -> dispatch.DispatchLoop:
    loop = dispatch.DispatchLoop(SimpleNamespace(pool_id=1, token="t", pk=1))
    loop.lanes.sync([(pod, f"http://pod-{pod}", lanes, "") for pod in range(1, pods + 1)], FleetCounts(ready=pods))
    return loop


def test_a_free_pod_gets_pages_of_its_document_queued_behind_a_long_one_whose_pods_are_busy():
    # A long document's pages fill the head of the queue (more than a look at the next pages saw)
    # and its pod is busy; pod 2 holds the next document: it reads it, rather than idle.
    loop = many_pods(2, 1)
    loop.remember(1, "a" * 64)
    loop.remember(2, "b" * 64)
    loop.lanes.lease([1], anywhere=False)
    loop.queue.extend([claimed(n, "a", pages=100) for n in range(1, 101)] + [claimed(101, "b")])
    loop.remember(2, "a" * 64)  # (pod 2 holds the long one too: a copy does not decide it)

    page, lane = loop.next_forward()

    assert (page.id, lane.pod_id) == (1, 2)  # the long document's, on a pod that holds it
    loop.forget(2, "a" * 64)
    loop.lanes.release(lane)
    page, lane = loop.next_forward()
    assert (page.id, lane.pod_id) == (101, 2)


def test_a_new_document_far_down_the_queue_goes_to_a_free_lane_while_the_first_ones_wait_for_their_pods(
    monkeypatch,
):
    # More documents queued than the loop looks at for their pods, each of the first held by a busy
    # pod: the free pod takes the first document no pod holds, wherever it is, at once.
    loop = many_pods(2, 1)
    loop.lanes.lease([1], anywhere=False)
    first = documents.AFFINITY_LOOK_AHEAD + 5
    for n in range(first):
        loop.remember(1, sha(f"held-{n}"))
    loop.queue.extend([claimed(n, f"held-{n}") for n in range(first)] + [claimed(999, "new")])
    monkeypatch.setattr(dispatch.time, "monotonic", lambda: 100.0)

    page, lane = loop.next_forward()

    assert (page.id, lane.pod_id) == (999, 2)


def test_the_free_lanes_side_finds_a_pod_holding_a_document_among_many_holders():
    # Every pod holds the document; the few a lease looks at first are busy, another has a lane free.
    loop = many_pods(8, 1)
    for pod in range(1, 9):
        loop.remember(pod, "a" * 64)
    for pod in (1, 2, 3, 4, 5, 6, 7):
        assert loop.lanes.lease([pod], anywhere=False).pod_id == pod
    loop.queue.extend([claimed(1, "a")])

    page, lane = loop.next_forward()

    assert (page.id, lane.pod_id) == (1, 8)
    assert loop.documents_sent == 0 and not loop.puts  # no copy: pod 8 holds it


def test_a_small_document_crosses_to_a_free_pod_after_as_long_as_sending_it_takes(monkeypatch):
    loop = many_pods(2, 1)
    loop.remember(1, "a" * 64)
    loop.lanes.lease([1], anywhere=False)
    size = 64 * 1024  # sent in about a millisecond at AFFINITY_COPY_BYTES_PER_SECOND
    loop.queue.extend([claimed(1, "a", size=size)])
    clock = [100.0]
    monkeypatch.setattr(dispatch.time, "monotonic", lambda: clock[0])

    assert loop.next_forward() == (None, None)
    clock[0] += size / documents.AFFINITY_COPY_BYTES_PER_SECOND + 1e-6
    page, lane = loop.next_forward()

    assert (page.id, lane.pod_id) == (1, 2)  # not the half second a large document waits
    assert size / documents.AFFINITY_COPY_BYTES_PER_SECOND < documents.AFFINITY_WAIT_SECONDS / 100


def test_a_large_or_unknown_sized_document_waits_the_whole_affinity_wait():
    large = claimed(1, "a", size=10 * documents.AFFINITY_COPY_BYTES_PER_SECOND)
    assert documents.affinity_wait(large) == documents.AFFINITY_WAIT_SECONDS
    assert documents.affinity_wait(claimed(1, "a")) == documents.AFFINITY_WAIT_SECONDS


def test_the_queue_keeps_each_documents_pages_together_and_a_page_put_back_first():
    queue = PageQueue([claimed(1, "a"), claimed(2, "b"), claimed(3, "a"), claimed(4, "c")])

    assert [p.id for p in queue] == [1, 3, 2, 4] and len(queue) == 4 and queue.documents_queued() == 3
    assert queue.queued("a" * 64) == 2 and queue.queued("z" * 64) == 0
    queue.appendleft(claimed(5, "c"))
    assert [p.id for p in queue] == [5, 4, 1, 3, 2]
    assert queue.popleft().id == 5 and queue.take("a" * 64).id == 1
    assert [p.id for p in queue] == [4, 3, 2] and queue.head().id == 4
    queue.clear()
    assert not queue and len(queue) == 0


# --- documents sent a few at a time --------------------------------------------------------------


def test_the_document_gate_lets_documents_in_first_come_first_served_within_its_bytes():
    async def scenario():
        gate = sending.DocumentGate(100)
        order: list[str] = []
        release = {name: asyncio.Event() for name in "abcde"}

        async def send(name: str, size: int):
            async with gate.room(size):
                order.append(name)
                await release[name].wait()

        tasks = [asyncio.create_task(send(name, size)) for name, size in
                 [("a", 60), ("b", 60), ("c", 10), ("d", 500), ("e", 10)]]  # fmt: skip
        await asyncio.sleep(0)
        # a is out; b does not fit beside it, and c, which would, waits its turn behind b.
        assert order == ["a"] and gate.held == 60
        release["a"].set()
        await asyncio.sleep(0.01)
        assert order == ["a", "b", "c"] and gate.held == 70
        release["b"].set()
        release["c"].set()
        await asyncio.sleep(0.01)
        # d, larger than the gate, goes alone once nothing else is out; e waits behind it.
        assert order == ["a", "b", "c", "d"] and gate.held == 500
        release["d"].set()
        await asyncio.sleep(0.01)
        assert order == ["a", "b", "c", "d", "e"]
        release["e"].set()
        await asyncio.gather(*tasks)
        assert gate.held == 0

    asyncio.run(scenario())


def test_a_document_cancelled_while_it_waits_for_the_gate_takes_no_room_and_holds_no_one_up():
    async def scenario():
        gate = sending.DocumentGate(100)
        release = asyncio.Event()
        entered: list[str] = []

        async def send(name: str, size: int):
            async with gate.room(size):
                entered.append(name)
                await release.wait()

        first = asyncio.create_task(send("a", 90))
        await asyncio.sleep(0)
        waiting = asyncio.create_task(send("b", 50))
        behind = asyncio.create_task(send("c", 10))
        await asyncio.sleep(0)
        assert entered == ["a"]
        waiting.cancel()  # (its PUT's page was given up)
        await asyncio.sleep(0.01)
        assert entered == ["a", "c"] and gate.held == 100  # c fits beside a once b is gone
        release.set()
        await asyncio.gather(first, behind)
        assert waiting.cancelled() and gate.held == 0

    asyncio.run(scenario())


def test_a_pod_holding_more_documents_than_are_queued_is_matched_from_the_queues_side():
    loop = many_pods(2, 1)
    loop.lanes.lease([1], anywhere=False)
    for n in range(50):  # pod 2 has been sent many documents over the loop's life
        loop.remember(2, sha(f"old-{n}"))
    loop.remember(1, "b" * 64)
    loop.remember(2, "b" * 64)
    loop.queue.extend([claimed(1, "b")])

    assert loop._holds_queued(2) and not loop._holds_queued(3)
    page, lane = loop.next_forward()
    assert (page.id, lane.pod_id) == (1, 2)


def test_the_gate_passes_over_a_waiter_cancelled_before_it_could_leave_the_line():
    # The room a sender leaves is handed on in the same step; a waiter cancelled a moment before
    # (its future cancelled, its own clean-up not run yet) is passed over, not given room.
    async def scenario():
        gate = sending.DocumentGate(100)
        release = asyncio.Event()

        async def send(size: int):
            async with gate.room(size):
                await release.wait()

        first = asyncio.create_task(send(90))
        await asyncio.sleep(0)
        waiting = asyncio.create_task(send(50))
        behind = asyncio.create_task(send(50))
        await asyncio.sleep(0)
        release.set()  # first leaves the room before...
        waiting.cancel()  # ...the cancelled waiter has run its clean-up
        await asyncio.gather(first, behind)
        assert waiting.cancelled() and gate.held == 0

    asyncio.run(scenario())


def test_a_document_waits_for_the_gate_no_longer_than_its_deadline_and_leaves_the_line():
    async def scenario():
        gate = sending.DocumentGate(100)
        release = asyncio.Event()
        entered: list[str] = []

        async def send(name: str, size: int, within: float | None = None):
            async with gate.room(size, within=within):
                entered.append(name)
                await release.wait()

        first = asyncio.create_task(send("a", 90))
        await asyncio.sleep(0)
        late = asyncio.create_task(send("b", 50, within=0.05))
        behind = asyncio.create_task(send("c", 10))
        with pytest.raises(sending.DocumentWaited):
            await late
        assert entered == ["a", "c"] and gate.held == 100  # c, behind it, fits beside a
        release.set()
        await asyncio.gather(first, behind)
        assert gate.held == 0

    asyncio.run(scenario())


def test_a_page_whose_document_found_no_room_in_time_goes_back_to_the_queue_and_spends_no_attempt():
    async def scenario():
        loop = many_pods(1, 2)
        loop.document_wait_seconds = 0.05
        release = asyncio.Event()

        async def occupy():  # another document's PUT, out for longer than the deadline
            async with loop.document_gate.room(loop.document_gate.limit):
                await release.wait()

        out = asyncio.create_task(occupy())
        await asyncio.sleep(0)
        page, lane = claimed(1, "a", size=10), loop.lanes.lease()
        loop.inflight[page.id] = page

        assert await loop.asked(page, lane) is None  # no answer, no attempt failed (no database asked)
        assert [p.id for p in loop.queue] == [1] and "a" * 64 not in loop.held.get(1, ())
        release.set()
        await out

    asyncio.run(scenario())
