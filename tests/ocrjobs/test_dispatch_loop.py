"""The dispatch loop run whole, on the real database, sending pages to a simulator pod: what
its heartbeat renews, and what it does with pages it holds that it should no longer send."""

from __future__ import annotations

import asyncio
import gc

import pytest

from fleetadmin.collector import GEN0_THRESHOLD
from ocrjobs.dispatch import database
from ocrjobs.dispatch import loop as dispatch
from ocrjobs.models import Job, Page
from ocrjobs.services.dispatchers import dispatcher_register
from ocrjobs.services.jobs import job_cancel
from ocrjobs.services.pages import pages_claim
from tests.factories import image_bytes, pdf_bytes
from tests.ocrjobs.helpers import run_dispatch_loop, split, submit


@pytest.fixture
def quick_claims(settings, monkeypatch):
    # Claims that lapse within seconds unless renewed, renewed well within that.
    settings.PAGE_CLAIM_SECONDS = 1.5
    monkeypatch.setattr(dispatch, "HEARTBEAT_SECONDS", 0.5)


def test_a_page_the_loop_lost_track_of_is_not_renewed_and_is_claimed_again_while_it_runs(
    sim_pool, ordinary_user, quick_claims
):
    job = submit(ordinary_user, {"note.png": image_bytes(["a note"])}, pool_key=sim_pool.pool.key)
    split(job)
    lost: list = []

    def claim_behind_its_back(dispatcher):
        """Claimed with the dispatcher's own token, never handed to its loop: a page it lost track of."""
        lost.extend(pages_claim(pool_id=sim_pool.pool.pk, token=dispatcher.token, limit=1))

    run_dispatch_loop(sim_pool.pool, before=claim_behind_its_back)

    # Its heartbeats renewed only the pages in hand: the lost page's claim lapsed, the page waited
    # again, and the same loop, still running, claimed and sent it. Before, renewed with every page
    # of the token, it stayed claimed until the loop ended, idle, with the page never done.
    page = Page.objects.get(pk=lost[0].id)
    assert (page.status, page.attempts >= 2) == (Page.Status.DONE, True)
    assert Job.objects.get(pk=job.pk).status == Job.Status.DONE
    assert sim_pool.pages_received() == 1


def test_pages_claimed_ahead_whose_job_is_cancelled_are_dropped_at_the_next_beat_and_never_sent(
    sim_pool, ordinary_user
):
    job = submit(ordinary_user, {"report.pdf": pdf_bytes()}, pool_key=sim_pool.pool.key)
    split(job)
    dispatcher = dispatcher_register(pool_id=sim_pool.pool.pk)
    loop = dispatch.DispatchLoop(dispatcher)

    async def claimed_ahead_then_cancelled():
        # Claimed and waiting for a lane (every lane busy, say) when the job is cancelled.
        loop.queue.extend(await loop.db(pages_claim, pool_id=sim_pool.pool.pk, token=loop.token, limit=10))
        assert len(loop.queue) == 3
        await loop.db(job_cancel, job=job)
        await loop.heartbeat()
        await loop.run()  # lanes free: what is left in its queue goes out

    asyncio.run(claimed_ahead_then_cancelled())

    assert sim_pool.pages_received() == 0
    assert set(job.pages.values_list("status", flat=True)) == {Page.Status.CANCELLED}


def test_results_a_flush_could_not_store_are_stored_by_a_later_one_and_no_page_runs_twice(
    sim_pool, ordinary_user, monkeypatch
):
    # The database away for longer than a flush's own retries (review M6): the flusher used to die
    # with its batch, leaving the pages to lapse and run again.
    from django.db import OperationalError

    job = submit(ordinary_user, {"report.pdf": pdf_bytes()}, pool_key=sim_pool.pool.key)
    split(job)
    store, failing = database.store, {"left": 4}  # more than one flush's three tries

    def store_unless_away(**batch):
        if batch["results"] and failing["left"]:
            failing["left"] -= 1
            raise OperationalError("the database went away")
        return store(**batch)

    monkeypatch.setattr(database, "store", store_unless_away)
    monkeypatch.setattr(dispatch, "FLUSH_BACKOFF_MAX_SECONDS", 0.2)

    loop = run_dispatch_loop(sim_pool.pool)

    assert failing["left"] == 0
    pages = list(job.pages.all())
    assert [(page.status, page.attempts) for page in pages] == [(Page.Status.DONE, 1)] * 3
    assert sim_pool.pages_received() == 3
    assert loop.done == 3


def test_the_loop_runs_with_a_quiet_collector_undone_when_it_ends(sim_pool, ordinary_user, monkeypatch):
    # fleetadmin/collector.py: its full collections held the loop for up to 308 ms at 256 pods x 8 lanes.
    job = submit(ordinary_user, {"note.png": image_bytes(["a note"])}, pool_key=sim_pool.pool.key)
    split(job)
    seen = []
    refresh = dispatch.DispatchLoop.refresh_pods

    async def refresh_pods(self):
        seen.append((gc.get_freeze_count() > 0, gc.get_threshold()[0]))
        await refresh(self)

    monkeypatch.setattr(dispatch.DispatchLoop, "refresh_pods", refresh_pods)
    run_dispatch_loop(sim_pool.pool)

    assert seen and set(seen) == {(True, GEN0_THRESHOLD)}
    assert gc.get_freeze_count() == 0 and gc.get_threshold()[0] != GEN0_THRESHOLD
    assert Job.objects.get(pk=job.pk).status == Job.Status.DONE
