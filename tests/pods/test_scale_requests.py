"""Scale requests: a row that a short task starts and passes advance until the pool is at its
target (done) or cannot get there (failed), never left pending."""

from __future__ import annotations

from datetime import datetime

import pytest
from django.utils import timezone
from django_q.brokers import get_broker

from pods import tasks
from pods.models import Alert, Pod, ScaleRequest
from pods.services import passes, scale_requests
from pods.services.scale_requests import scale_request_create, scale_request_step, scale_requests_due
from tests.pods.conftest import GOOD
from tests.pods.helpers import boot_until_settled
from tools.processes import wait_for

pytestmark = pytest.mark.usefixtures("transactional_db")  # a pass's steps run on threads of their own


@pytest.fixture(autouse=True)
def every_pass_looks(monkeypatch):
    # A started request is looked at every LOOK_SECONDS (its own test below); here every pass
    # looks, as if that much time had gone by between the passes the tests run.
    monkeypatch.setattr(scale_requests, "LOOK_SECONDS", 0.0)


def _boot_what_is_booting() -> None:
    """Drive the boots to their end here, as passes would, without running the other kinds of work."""
    for pod_id in Pod.objects.filter(state=Pod.State.BOOTING, cancel_requested_at=None).values_list("pk", flat=True):
        boot_until_settled(pod_id)


def _state(request: ScaleRequest) -> str:
    request.refresh_from_db()
    return request.state


def test_a_target_above_max_parallel_boots_ends_done_at_the_target(sim, pool):
    sim.set_capacity(GOOD, "SECURE", "EU-RO-1", 8)
    pool.max_pods, pool.max_parallel_boots = 8, 2
    pool.save()
    request = scale_request_create(pool=pool, pods=5)
    tasks.scale_pool(request.pk)  # the start, as a worker runs it: the first wave only
    assert Pod.objects.filter(state=Pod.State.BOOTING).count() == 2
    most_booting = 0

    def advanced() -> bool:
        nonlocal most_booting
        most_booting = max(most_booting, Pod.objects.filter(state=Pod.State.BOOTING).count())
        passes.pass_run()  # what the workers' clock asks for every PASS_INTERVAL_SECONDS: boot steps too
        return _state(request) != ScaleRequest.State.PENDING

    wait_for(advanced, 120, lambda: f"still pending: {request.result}")

    assert request.state == ScaleRequest.State.DONE, request.result
    assert request.result["ready"] == 5 and request.result["booting"] == 0 and request.result["booted"] == 5
    assert Pod.objects.filter(state=Pod.State.READY).count() == 5
    assert most_booting == 2  # wave after wave, never above the pool's parallel-boot cap


def test_a_request_whose_start_task_was_lost_fails_at_its_deadline(sim, pool, queued):
    request = scale_request_create(pool=pool, pods=2)
    assert queued() == ["pods.tasks.scale_pool", "pods.tasks.advance_pods"]
    assert request.deadline_at is not None
    get_broker().purge_queue()  # the start is lost (on Redis, a worker killed with -9 loses its task)
    passes.pass_run()
    assert _state(request) == ScaleRequest.State.PENDING  # it may still come, until the deadline
    ScaleRequest.objects.filter(pk=request.pk).update(deadline_at=timezone.now())  # the clock moves on

    passes.pass_run()

    assert _state(request) == ScaleRequest.State.FAILED
    assert "start never ran" in request.result["error"]
    assert scale_requests_due(now=timezone.now(), limit=10) == []


def test_a_request_whose_boots_hang_fails_at_its_deadline(sim, pool):
    """What a scale task that outlived Q_TIMEOUT left behind: pending for ever. Now nothing waits
    in a worker, and the deadline ends the request whatever its boots do."""
    request = scale_request_create(pool=pool, pods=2)
    tasks.scale_pool(request.pk)
    passes.pass_run()  # the boots never advance: no worker runs them
    assert _state(request) == ScaleRequest.State.PENDING
    assert request.result["booting"] == 2 and request.result["booted"] == 2

    ScaleRequest.objects.filter(pk=request.pk).update(deadline_at=timezone.now())
    passes.pass_run()

    assert _state(request) == ScaleRequest.State.FAILED
    assert "deadline" in request.result["error"] and request.result["booting"] == 2


def test_a_newer_request_supersedes_the_older_pending_one(sim, pool):
    older = scale_request_create(pool=pool, pods=3)
    newer = scale_request_create(pool=pool, pods=1)

    assert _state(older) == ScaleRequest.State.FAILED
    assert older.result["error"] == f"superseded by request {newer.pk}"
    tasks.scale_pool(older.pk)  # its start, run late, changes nothing
    pool.refresh_from_db()
    assert pool.min_pods == 0 and not Pod.objects.exists()
    tasks.scale_pool(newer.pk)
    pool.refresh_from_db()
    assert pool.min_pods == 1 and Pod.objects.count() == 1


def test_a_blocked_request_fails_with_the_reason(sim, pool):
    Alert.raise_(pool=pool, kind=Alert.Kind.AUTH, message="runpod: 401")
    request = scale_request_create(pool=pool, pods=2)
    assert "credentials" in tasks.scale_pool(request.pk)["result"]["blocked"]

    passes.pass_run()

    assert _state(request) == ScaleRequest.State.FAILED
    assert "no more can boot" in request.result["error"] and "credentials" in request.result["error"]
    assert request.result["booted"] == 0


def test_a_request_whose_boots_fail_gives_up_once_as_many_failed_as_it_wanted(sim, pool):
    sim.set_faults([{"kind": "no_capacity"}])
    request = scale_request_create(pool=pool, pods=1)
    tasks.scale_pool(request.pk)
    _boot_what_is_booting()

    scale_request_step(request.pk)

    assert _state(request) == ScaleRequest.State.FAILED
    assert request.result["boots_failed"] == 1 and "1 boots failed" in request.result["error"]
    assert Pod.objects.count() == 1  # no boot after boot while the provider has nothing


def test_a_started_request_is_due_a_look_every_few_seconds_not_every_pass(sim, pool, monkeypatch):
    monkeypatch.setattr(scale_requests, "LOOK_SECONDS", 2.0)
    request = scale_request_create(pool=pool, pods=1)
    now = timezone.now()
    assert scale_requests_due(now=now, limit=10) == []  # not started: only its deadline makes it due
    assert scale_requests_due(now=request.deadline_at + timezone.timedelta(seconds=1), limit=10) == [request.pk]
    tasks.scale_pool(request.pk)
    assert scale_requests_due(now=timezone.now(), limit=10) == [request.pk]  # started: looked at at once

    scale_request_step(request.pk)

    request.refresh_from_db()
    looked = datetime.fromisoformat(request.result["checked_at"])
    assert scale_requests_due(now=looked + timezone.timedelta(seconds=1.9), limit=10) == []
    assert scale_requests_due(now=looked + timezone.timedelta(seconds=2), limit=10) == [request.pk]
