"""pods/services/passes.py: one pass at a time, its lease renewed while its steps run, a lost pass sent again."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from pods.models import PassLease
from pods.services import lifecycle, passes


@pytest.fixture
def slow_work(monkeypatch):
    """One kind of work with one row due, whose step holds until the test lets it go."""
    started, release = threading.Event(), threading.Event()

    def step(row_id: int) -> None:
        started.set()
        assert release.wait(30), "the test never let the step go"

    work = passes.Work("slow", lambda *, now, limit: [1], step)
    monkeypatch.setattr(passes, "kinds_of_work", lambda: [work])
    return started, release


def test_a_pass_renews_its_short_lease_while_a_step_outlasts_it(slow_work, settings, transactional_db):
    started, release = slow_work
    settings.PASS_LEASE_SECONDS = 0.6
    results = []

    def run() -> None:
        results.append(passes.pass_run())
        connection.close()

    first = threading.Thread(target=run)
    first.start()
    try:
        assert started.wait(30)
        lease = PassLease.objects.get(name=passes.KIND)
        # Wait on the lease itself: renewed, it outlives the length it was first taken for.
        taken_until = lease.task_lease_until
        deadline = timezone.now() + timedelta(seconds=30)
        while PassLease.objects.get(pk=lease.pk).task_lease_until == taken_until:
            assert timezone.now() < deadline, "the lease was never renewed"
        assert PassLease.objects.get(pk=lease.pk).task_lease_until > taken_until
        assert passes.pass_run() is None  # a second pass finds it held, and leaves
    finally:
        release.set()
        first.join(30)
    assert results[0] is not None and results[0].steps == {"slow": 1}
    # Released at the end: its row is due again, so the next pass is queued (no token), not held.
    assert PassLease.objects.get(name=passes.KIND).task_lease_token == ""


def test_a_pass_killed_mid_step_holds_the_lease_no_longer_than_its_short_length(settings, db):
    settings.PASS_LEASE_SECONDS = 30
    row, _ = PassLease.objects.get_or_create(name=passes.KIND)
    # What a pass killed with -9 leaves: a token and a deadline nobody renews.
    PassLease.objects.filter(pk=row.pk).update(
        task_lease_token="dead", task_lease_until=timezone.now() + timedelta(seconds=30)
    )
    assert passes.pass_request() is False  # held: no second pass beside it
    PassLease.objects.filter(pk=row.pk).update(task_lease_until=timezone.now() - timedelta(seconds=1))  # 30 s on
    assert passes.pass_request() is True


def test_a_pass_advances_a_release_while_a_webhook_receiver_holds_an_attempt(sim, pool, ordinary_user, settings,
                                                                            transactional_db):  # fmt: skip
    # Review H1: a pass used to wait for every step, webhook posts included, so a receiver that
    # trickled held boots, releases and scale requests for as long as django-q2 let it.
    from ocrjobs.models import Job, WebhookDelivery
    from ocrjobs.services import webhooks
    from tests import hostile
    from tests.pods.test_releases import _at_the_provider, _pod_at_the_provider

    settings.URL_FETCH_ALLOW_PRIVATE = True
    settings.WEBHOOK_TIMEOUT_SECONDS = 120  # the receiver may hold the attempt that long
    receiver = hostile.HostilePeer(hostile.trickled_headers)
    job = Job.objects.create(pool=pool, owner=ordinary_user, callback_url=receiver.url("/hook"),
                             status=Job.Status.DONE)  # fmt: skip
    delivery = WebhookDelivery.objects.create(job=job, event="done", url=job.callback_url, body="{}",
                                              next_attempt_at=timezone.now())  # fmt: skip
    assert passes.pass_run().steps["webhook"] == 1  # claimed and sent to a task of its own
    lease = WebhookDelivery.objects.get(pk=delivery.pk).task_lease_token

    def attempt() -> None:  # the short task that makes the attempt, in a worker of its own
        webhooks.delivery_attempt(delivery_id=delivery.pk, lease=lease)
        connection.close()

    worker = threading.Thread(target=attempt, daemon=True)
    worker.start()
    try:
        assert receiver.connected.wait(30)
        pod = _pod_at_the_provider(pool)
        assert lifecycle.pod_release(pod=pod, reason="test") is True

        result = passes.pass_run()

        assert result.steps["terminate"] == 1 and result.steps["webhook"] == 0
        assert not _at_the_provider(pod)  # released at the provider...
        assert worker.is_alive()  # ...while the receiver still holds the attempt
    finally:
        receiver.close()
        worker.join(60)
