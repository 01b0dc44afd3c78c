"""The job page, live (issue 42): who may watch a job (its owner and staff, checked in the
consumer), what a watcher receives (the job's sections, and only the viewer pages it holds, when
they move), and that pushes are coalesced per job, not one per page."""

from __future__ import annotations

import json

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.utils import timezone

from ocrjobs import live
from ocrjobs.consumers import CLOSE_FORBIDDEN
from ocrjobs.models import Job, Page
from pods import broadcast
from pods.models import Pod
from tests.ocrjobs.helpers import job_with_pages
from tests.pods.test_consumers import GUARD, ORIGIN, WEBSOCKETS, closed_with, log_out, run, session_cookie

pytestmark = pytest.mark.usefixtures("transactional_db")


@pytest.fixture
def running(ordinary_user, local_pool):
    return job_with_pages(ordinary_user, local_pool, status=Job.Status.RUNNING, pages={"done": 1, "pending": 3})


def _watcher(job: Job, cookie=None) -> WebsocketCommunicator:
    headers = [ORIGIN, cookie] if cookie is not None else [ORIGIN]
    return WebsocketCommunicator(WEBSOCKETS, f"/ws/jobs/{job.pk}", headers=headers)


async def _until(comm: WebsocketCommunicator, found) -> list[str]:
    """The messages received until they satisfy ``found``, together (within GUARD seconds a
    message: against hangs only)."""
    received = []
    while True:
        received.append(await comm.receive_from(timeout=GUARD))
        if found("".join(received)):
            return received


def _read(page: Page) -> None:
    Page.objects.filter(pk=page.pk).update(status=Page.Status.DONE, attempts=1, result='{"text": "read live"}',
                                           finished_at=timezone.now())  # fmt: skip


def test_another_user_may_not_watch_a_job(running, outsider):
    cookie = session_cookie(outsider)

    async def scenario():
        comm = _watcher(running, cookie)
        assert (await comm.connect(timeout=GUARD))[0]  # accepted only to say why it is closed
        assert await comm.receive_output(timeout=GUARD) == {"type": "websocket.close", "code": CLOSE_FORBIDDEN}
        assert not broadcast.broadcaster().feed(live.JobFeed).watching()

    run(scenario)


def test_an_anonymous_watcher_is_closed_with_4401(running):
    async def scenario():
        comm = _watcher(running)
        assert (await comm.connect(timeout=GUARD))[0]
        assert await comm.receive_output(timeout=GUARD) == {"type": "websocket.close", "code": 4401}

    run(scenario)


def test_the_owner_gets_the_pages_it_holds_as_they_are_read_and_no_other(running, ordinary_user):
    pages = list(running.pages.order_by("number"))
    held, not_held = pages[1], pages[2]
    cookie = session_cookie(ordinary_user)

    async def scenario():
        comm = _watcher(running, cookie)
        assert (await comm.connect(timeout=GUARD))[0]
        await comm.send_to(text_data=json.dumps({"pages": {str(held.pk): held.live_state}, "fill": False}))
        first = await _until(comm, lambda m: 'id="job-progress"' in m and 'id="job-actions"' in m)
        await database_sync_to_async(_read)(held)
        await database_sync_to_async(_read)(not_held)
        later = await _until(comm, lambda m: f'id="viewer-page-{held.pk}"' in m and "3 of 4 pages done" in m)
        await comm.disconnect()
        return first, later

    first, later = run(scenario)
    assert "1 of 4 pages done" in "".join(first) and 'id="job-actions"' in "".join(first)
    pushed = "".join(later)
    assert "read live" in pushed and f'id="viewer-page-{held.pk}" hx-swap-oob="true"' in pushed
    assert f'id="viewer-page-{not_held.pk}"' not in pushed  # the page does not show it: not sent
    assert "All pages (4)</span>" in pushed  # the viewer's counts are swapped in with the sections


def test_a_job_page_is_closed_when_its_session_ends(running, ordinary_user, monkeypatch):
    monkeypatch.setattr(broadcast, "SESSION_CHECK_SECONDS", 0.2)
    cookie = session_cookie(ordinary_user)

    async def scenario():
        comm = _watcher(running, cookie)
        assert (await comm.connect(timeout=GUARD))[0]
        await _until(comm, lambda m: 'id="job-progress"' in m)
        await database_sync_to_async(log_out)(cookie)
        assert await closed_with(comm, GUARD) == 4401
        assert not broadcast.broadcaster().feed(live.JobFeed).watching()

    run(scenario)


def test_staff_may_watch_anybodys_job_and_get_no_rebuild_button_of_the_owners(admin_user, ordinary_user, local_pool):
    job = job_with_pages(ordinary_user, local_pool, status=Job.Status.DONE, pages={"done": 2})
    cookie = session_cookie(admin_user)

    async def scenario():
        comm = _watcher(job, cookie)
        assert (await comm.connect(timeout=GUARD))[0]
        messages = await _until(comm, lambda m: 'id="job-actions"' in m)
        await comm.disconnect()
        return "".join(messages)

    html = run(scenario)
    assert "result.txt" in html and "searchable PDFs" not in html and "Cancel job" not in html


def test_an_empty_viewer_gets_the_first_pages_once_they_are_made(ordinary_user, local_pool):
    job = job_with_pages(ordinary_user, local_pool, status=Job.Status.RUNNING, pages={})
    document = job.documents.get()
    cookie = session_cookie(ordinary_user)

    async def scenario():
        comm = _watcher(job, cookie)
        assert (await comm.connect(timeout=GUARD))[0]
        await comm.send_to(text_data=json.dumps({"pages": {}, "fill": True}))
        await _until(comm, lambda m: 'id="job-progress"' in m)
        await database_sync_to_async(Page.objects.create)(job=job, document=document, pool=local_pool, number=1)
        messages = await _until(comm, lambda m: 'id="viewer-pages"' in m)
        await comm.disconnect()
        return messages[-1]

    html = run(scenario)
    page = job.pages.get()
    assert 'id="viewer-pages" hx-swap-oob="true"' in html and f'id="viewer-page-{page.pk}"' in html
    assert "data-fill" not in html


# --- one pass, as the broadcaster's thread runs it -------------------------------------------------


def _watch(job: Job, user, pages: list[Page]) -> live.Watch:
    subscriber = broadcast.Subscriber(user_id=user.pk, is_staff=False)
    return live.Watch(subscriber=subscriber, job_id=job.pk, pages={p.pk: p.live_state for p in pages})


def test_a_pass_sends_a_job_that_moved_once_and_only_its_held_pages_that_moved(ordinary_user, local_pool):
    job = job_with_pages(ordinary_user, local_pool, status=Job.Status.RUNNING, pages={"pending": 300})
    pages = list(job.pages.order_by("number"))
    watches = {"a": _watch(job, ordinary_user, pages[:25]), "b": _watch(job, ordinary_user, pages[25:50])}
    first = live.job_pass(watches, {})
    assert set(first.to_groups) == {job.pk}
    assert all('id="viewer-page-' not in "".join(parts) for parts in first.to_channels.values())

    # 300 pages read between two passes: one push for the job, each watcher its own moved pages.
    for page in pages:
        _read(page)
    second = live.job_pass(watches, dict(first.fingerprints))
    assert list(second.to_groups) == [job.pk] and second.to_groups[job.pk].count('id="job-progress"') == 1
    for channel, held in (("a", pages[:25]), ("b", pages[25:50])):
        sent = "".join(second.to_channels[channel])
        assert sent.count('<article class="viewer-page') == 25
        assert all(f'id="viewer-page-{page.pk}"' in sent for page in held)

    # Nothing moved since: nothing to send.
    for channel, shown in second.shown.items():
        watches[channel].pages.update(shown)
        watches[channel].fresh = False
    third = live.job_pass(watches, dict(second.fingerprints))
    assert not third.to_groups and not any(third.to_channels.values())


def test_the_feed_passes_at_most_once_a_second_however_often_it_is_ticked(ordinary_user, local_pool, monkeypatch):
    job = job_with_pages(ordinary_user, local_pool, status=Job.Status.RUNNING, pages={"pending": 1})
    passes = []

    async def counted(function, *args):
        passes.append(args)
        return live.Pass()

    monkeypatch.setattr(live, "run_in_render_thread", counted)
    feed = live.JobFeed()
    feed.watch("a", broadcast.Subscriber(user_id=ordinary_user.pk, is_staff=False), job.pk)

    async def scenario():
        for now in (100.0, 100.3, 100.6, 100.89, 101.0, 101.5, 102.0):
            await feed.tick(None, now=now)

    run(scenario)
    assert len(passes) == 3  # at 100.0, 101.0 and 102.0


def test_a_report_is_read_strictly():
    assert live.parse_report('{"pages": {"12": "done:1:0", "x": "a", "13": 5}, "fill": true}') == (
        {12: "done:1:0"}, True
    )  # fmt: skip
    assert live.parse_report("not json") is None
    assert live.parse_report('["pages"]') is None
    assert live.parse_report("x" * (live.MESSAGE_BYTES_MAX + 1)) is None


def test_a_page_a_dispatcher_claimed_ahead_waits_and_one_out_at_a_pod_runs(ordinary_user, local_pool):
    # A dispatcher claims a page ahead for each lane; until it is sent the page has no pod. The job
    # page counted it as running: "2 running" beside a pool with no pod (issue 42, item 2).
    job = job_with_pages(ordinary_user, local_pool, status=Job.Status.RUNNING, pages={"running": 2, "pending": 1})
    at_pod, ahead = job.pages.filter(status=Page.Status.RUNNING).order_by("number")
    pod = Pod.objects.create(pool=local_pool, name="p", state=Pod.State.READY, lanes=1)
    Page.objects.filter(pk=at_pod.pk).update(pod=pod)

    counts = live.page_counts(job)

    assert (counts["running"], counts["pending"], counts["total"]) == (1, 2, 3)
    assert live.job_context(job, counts=counts)["progress"].running == 1
    assert {key: job.page_counts()[key] for key in ("running", "pending")} == {"running": 1, "pending": 2}  # the API's
