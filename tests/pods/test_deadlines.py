"""The scaler sizes a pool for the most urgent deadline of the work waiting, for a job's priority
(fastest, cheapest), and says when a deadline cannot be met and the earliest it could be."""

from __future__ import annotations

import pytest
from django.utils import timezone

from ocrjobs.models import Job, Page
from pods.models import Alert, Pod
from pods.services import scaler
from tests.pods.test_pod_services import _pages


@pytest.fixture
def sized(pool, settings):
    """A pool of up to 10 two-lane pods, 2 s a page, 60 s boots, 120 s drain target, no overhead cap."""
    settings.SCALE_SECONDS_PER_PAGE_GUESS = 2.0
    settings.SCALE_BOOT_SECONDS_GUESS = 60.0
    settings.SCALE_TARGET_SECONDS = 120.0
    settings.SCALE_MAX_OVERHEAD = 0.12
    pool.max_pods = 10
    pool.idle_seconds = 60
    pool.save()
    return pool


def _job_with(pool, pages: int, **schedule) -> Job:
    job = _pages(pool, pages)[0].job
    Job.objects.filter(pk=job.pk).update(**schedule)
    return job


def in_seconds(seconds: float):
    return timezone.now() + timezone.timedelta(seconds=seconds)


def test_without_a_deadline_the_pool_keeps_its_cost_aware_sizing(sized):
    _job_with(sized, 600)  # 1,200 lane-s: 5 pods to drain in 120 s, but the boots cost too much of it

    demand = scaler.pool_demand(sized)

    assert demand.sized_for == "balanced"
    assert demand.wanted == 1  # 0.12 × 1,200 / 2 lanes / (60 s boot + 60 s idle) = 0.6 pods paid for
    assert demand.missed_deadline == ""


def test_a_deadline_the_default_sizing_would_miss_gets_the_pods_to_meet_it(sized):
    job = _job_with(sized, 600, deadline=in_seconds(365))
    # One pod: 1,200 lane-s / 2 lanes = 600 s after a 60 s boot, past the deadline.
    # Meeting it: 1,200 / (2 lanes × (365 - 60) s) = 1.97: 2 pods.

    demand = scaler.pool_demand(sized)

    assert demand.wanted == 2
    assert demand.sized_for == f"deadline of job {job.pk}"
    assert demand.missed_deadline == ""


def test_the_most_urgent_deadline_of_the_waiting_work_sets_the_size(sized):
    _job_with(sized, 300, deadline=in_seconds(3600))
    urgent = _job_with(sized, 300, deadline=in_seconds(165))  # 1,200 lane-s in 105 s after boot: 6 pods

    demand = scaler.pool_demand(sized)

    assert demand.wanted == 6
    assert demand.sized_for == f"deadline of job {urgent.pk}"


def test_ready_pods_count_from_now_and_need_no_boot(sized):
    for n in range(2):
        Pod.objects.create(pool=sized, name=f"ready-{n}", state=Pod.State.READY, lanes=2, ready_at=timezone.now())
    _job_with(sized, 600, deadline=in_seconds(330))  # 2 ready pods do 4 lanes × 330 s = 1,320 ≥ 1,200

    assert scaler.pool_demand(sized).wanted == 2


def test_a_deadline_max_pods_cannot_meet_raises_an_alert_with_the_earliest_time(sized):
    job = _job_with(sized, 600, deadline=in_seconds(90))  # 30 s after a boot: 20 pods; the pool has 10
    before = timezone.now()

    result = scaler.pool_tick(pool=sized)

    assert result.wanted == 10
    alert = Alert.objects.get(kind=Alert.Kind.DEADLINE, resolved_at__isnull=True)
    assert f"job {job.pk}'s deadline" in alert.message and "cannot be met" in alert.message
    # 10 pods × 2 lanes: 1,200 lane-s take 60 s after a 60 s boot.
    earliest = alert.message.rsplit("could be met is ", 1)[1]
    seconds = (timezone.datetime.fromisoformat(earliest) - before).total_seconds()
    assert 119 <= seconds <= 122

    Job.objects.filter(pk=job.pk).update(deadline=in_seconds(3600))
    scaler.pool_tick(pool=sized)
    assert not Alert.objects.filter(kind=Alert.Kind.DEADLINE, resolved_at__isnull=True).exists()


def test_a_fastest_job_gets_a_lane_for_every_page_within_max_pods(sized):
    _job_with(sized, 7, priority=Job.Priority.FASTEST)

    demand = scaler.pool_demand(sized)

    assert (demand.wanted, demand.sized_for) == (4, "fastest")  # 7 pages over 2-lane pods


def test_cheapest_jobs_alone_get_one_pod(sized, settings):
    settings.SCALE_MAX_OVERHEAD = 0.0  # no overhead cap: balanced would want 5 pods
    _job_with(sized, 600, priority=Job.Priority.CHEAPEST)

    demand = scaler.pool_demand(sized)

    assert (demand.wanted, demand.sized_for) == (1, "cheapest")


def test_a_job_past_its_budget_sets_no_deadline_sizing(sized):
    from decimal import Decimal

    from pods.models import SpendEntry

    job = _job_with(sized, 600, deadline=in_seconds(90), max_dollars=Decimal("1.00"))
    pod = Pod.objects.create(pool=sized, name="spent", state=Pod.State.TERMINATED, lanes=2)
    SpendEntry.objects.create(pod=pod, pool=sized, job=job, dollars=Decimal("1.50"), seconds=3600)

    demand = scaler.pool_demand(sized)

    assert demand.waiting == 0 and demand.missed_deadline == ""
    assert Page.objects.filter(job=job).count() == 600


def test_pages_the_split_has_not_made_yet_count_for_a_deadline(sized):
    """The split tells the scaler of its first batch only: a deadline sized on 20 split pages of
    a 600-page document would be missed by the other 580."""
    from ocrjobs.models import Document

    job = _job_with(sized, 20, deadline=in_seconds(365))
    Document.objects.filter(job=job).update(page_count=600, status=Document.Status.PENDING)

    demand = scaler.pool_demand(sized)

    assert demand.wanted == 2  # 600 pages × 2 s over 2 lanes × 305 s; the 20 split ones alone want 1
    assert demand.waiting == 20  # what waits in the database is still what it was


def test_without_a_deadline_unsplit_pages_change_nothing(sized):
    from ocrjobs.models import Document

    job = _job_with(sized, 20)
    Document.objects.filter(job=job).update(page_count=6000, status=Document.Status.PENDING)

    assert scaler.pool_demand(sized).wanted == 1
