"""The dispatch loop run whole, on the real database, sending pages to a simulator pod: what
its heartbeat renews, and what it does with pages it holds that it should no longer send."""

from __future__ import annotations

import pytest

from ocrjobs.dispatch import loop as dispatch
from ocrjobs.models import Job, Page
from ocrjobs.services.pages import pages_claim
from tests.factories import image_bytes
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
