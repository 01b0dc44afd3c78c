"""A job's long documents spread over the fleet a pod to a document, not each to every pod.

Pages are claimed a job at a time in strips of their documents' page numbers (ocrjobs/models.py
``claim_order``; tests/ocrjobs/services/test_claim_order.py), so a dispatcher's queue holds pages of
many documents at once. A pod whose documents' pods are all busy gets a copy of the document with
the most pages queued for each pod holding it, and a free lane is found among the free lanes
however many leases took lanes before it (documents.py ``_copied_next``, lanes.py ``lease_where``).
"""

from __future__ import annotations

from types import SimpleNamespace

from ocrjobs.dispatch import lanes
from ocrjobs.dispatch import loop as dispatch
from ocrjobs.dispatch.lanes import FleetCounts, LaneTable
from ocrjobs.models import CLAIM_STRIP_PAGES
from ocrjobs.services.pages import ClaimedPage


def many_pods(pods: int, lanes: int) -> dispatch.DispatchLoop:
    loop = dispatch.DispatchLoop(SimpleNamespace(pool_id=1, token="t", pk=1))
    loop.lanes.sync([(pod, f"http://pod-{pod}", lanes, "") for pod in range(1, pods + 1)], FleetCounts(ready=pods))
    return loop


def page_of(document: str, number: int, pages: int) -> ClaimedPage:
    return ClaimedPage(id=hash((document, number)) & 0xFFFFFFF, job_id=1, position=ord(document), document_id=1,
                       source=document, sha256=document * 64, number=number, languages="eng", attempts=1,
                       pages=pages, size=10_000_000)  # fmt: skip


def test_a_copy_goes_to_the_document_with_the_most_pages_queued_for_each_pod_that_holds_it():
    # Pods 1-2 hold "a", pod 3 holds "b", all busy; both are long and have 12 pages queued. Pod 4
    # takes "b": 12 pages for one pod against 6 each for two. The first in line took every copy.
    loop = many_pods(4, 1)
    for pod, document in ((1, "a"), (2, "a"), (3, "b")):
        loop.remember(pod, document * 64)
        loop.lanes.lease([pod], anywhere=False)
    loop.queue.extend([page_of("a", n, 1000) for n in range(1, 13)] + [page_of("b", n, 1000) for n in range(1, 13)])

    page, lane = loop.next_forward()

    assert (page.sha256, lane.pod_id) == ("b" * 64, 4)


def test_a_jobs_long_documents_claimed_in_strips_go_a_pod_to_a_document(monkeypatch):
    # 8 pods of 4 lanes, a job of 4 documents of 160 pages, claimed as pages_claim gives them (a
    # strip of each document in turn), the queue refilled to what the loop claims ahead. Each
    # document crosses to about a quarter of the fleet, and each pod keeps to one: 12 copies at most
    # (one per pod, and one per document as the last strips run out). Copies given to the first
    # document in line while a copy paid went 20 times.
    monkeypatch.setattr(dispatch.time, "monotonic", lambda: 100.0)
    pods, lanes, names, length = 8, 4, "abcd", 160
    loop = many_pods(pods, lanes)
    claims = [
        page_of(document, number, length)
        for first in range(1, length + 1, CLAIM_STRIP_PAGES)
        for document in names
        for number in range(first, first + CLAIM_STRIP_PAGES)
    ]
    copies, out = 0, []
    while claims or loop.queue or out:
        room = loop.lanes.free + loop.lanes.total - len(loop.queue)  # as claim_ahead
        loop.queue.extend(claims[:room])
        del claims[:room]
        page, lane = loop.next_forward()
        while lane is not None:
            if page.sha256 not in loop.held.get(lane.pod_id, ()):
                loop.remember(lane.pod_id, page.sha256)  # as start_put does
                copies += 1
            out.append(lane)
            page, lane = loop.next_forward()
        for lane in out:  # a round: every page out is done
            loop.lanes.release(lane)
        out.clear()

    assert copies <= pods + len(names)
    assert all(len(loop.held[pod]) <= 2 for pod in range(1, pods + 1))


def test_a_free_lane_is_found_past_the_lanes_that_preferred_leases_took():
    # Pods 1-17 had their lanes taken by preferred leases: their entries lead the free lanes and are
    # stale. The look at the next free lanes (FREE_LOOKS of them) once found only those, and a pod
    # that held a queued document idled while a copy went elsewhere.
    table = LaneTable()
    table.sync([(pod, f"http://pod-{pod}", 1, "") for pod in range(1, 21)], FleetCounts(ready=20))
    for pod in range(1, 18):
        assert table.lease([pod], anywhere=False).pod_id == pod

    lane = table.lease_where(lambda pod_id: pod_id == 20)

    assert lane is not None and lane.pod_id == 20
    assert lanes.FREE_LOOKS < 17  # (the stale entries were more than the looks)
