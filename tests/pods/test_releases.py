"""Releases: a pod ends in the database at once (its spend attributed) and a pass terminates
it at the provider, trying again with back-off until the provider confirms it."""

from __future__ import annotations

import json
import uuid
from decimal import Decimal

import pytest
from django.utils import timezone

from pods.models import Pod, Pool, SpendEntry, pod_name
from pods.providers.base import Offer, PodSpec
from pods.providers.runpod import RunPodProvider
from pods.services import lifecycle, passes
from tests.pods.conftest import GOOD

pytestmark = pytest.mark.usefixtures("transactional_db")  # a pass's steps run on threads of their own


def _pod_at_the_provider(pool: Pool) -> Pod:
    """A ready pod that really runs on the simulator (created there directly: not a boot's test)."""
    name = pod_name(pool, uuid.uuid4().hex[:8])
    created = RunPodProvider().create(
        PodSpec(name=name, lanes=pool.lanes_per_pod, offer=Offer(GOOD, "SECURE", "EU-RO-1"), image="example/pod:1")
    )
    billed_from = timezone.now() - timezone.timedelta(seconds=60)
    return Pod.objects.create(pool=pool, name=name, provider_id=created.provider_id, state=Pod.State.READY,
                              lanes=pool.lanes_per_pod, cost_per_hr=Decimal("0.30"), billed_from=billed_from,
                              ready_at=billed_from, base_url="http://x")  # fmt: skip


def _at_the_provider(pod: Pod) -> bool:
    return RunPodProvider().get(pod.provider_id) is not None


def _release_by_api(client, admin_token, pod: Pod) -> dict:
    response = client.post("/v1/runpod/release", data=json.dumps({"pod_id": pod.pk}),
                           content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {admin_token}")  # fmt: skip
    assert response.status_code == 200
    return response.json()


def test_a_release_from_the_api_ends_the_pod_at_once_and_a_pass_terminates_it(sim, pool, client, admin_token, queued):
    pod = _pod_at_the_provider(pool)

    body = _release_by_api(client, admin_token, pod)

    assert body["released"] is True and body["pod"]["state"] == "terminated"
    pod.refresh_from_db()
    assert pod.ended_at is not None and SpendEntry.objects.filter(pod=pod).exists()  # billed until now, not later
    assert pod.terminate_pending and _at_the_provider(pod)  # the front never calls the provider
    assert queued() == ["pods.tasks.advance_pods"]  # a pass is asked for at once
    assert lifecycle.terminations_due(now=timezone.now(), limit=10) == [pod.pk]

    result = passes.pass_run()

    assert result.steps["terminate"] == 1 and result.errors == 0
    assert not _at_the_provider(pod) and sim.stats()["terminate_calls"] == 1
    pod.refresh_from_db()
    assert not pod.terminate_pending and pod.step_at is None
    again = _release_by_api(client, admin_token, pod)
    assert again["released"] is False and again["already_ended"] is True
    passes.pass_run()
    assert sim.stats()["terminate_calls"] == 1 and SpendEntry.objects.filter(pod=pod).count() == 1


def test_a_terminate_the_provider_refuses_is_tried_again_on_a_later_pass_with_back_off(sim, pool):
    pod = _pod_at_the_provider(pool)
    assert lifecycle.pod_release(pod=pod, reason="test") is True
    # Every try of the provider's call (it retries transient errors itself) answers 502.
    sim.set_faults([{"kind": "http_error", "status": 502, "operation": "podTerminate"}])

    before = timezone.now()
    passes.pass_run()

    pod.refresh_from_db()
    assert pod.terminate_pending and _at_the_provider(pod)
    assert pod.step_at >= before + timezone.timedelta(seconds=lifecycle.TERMINATE_RETRY_MIN_SECONDS)
    calls = sim.stats()["terminate_calls"]
    passes.pass_run()  # not due yet: the provider is not asked again in a hot loop
    assert sim.stats()["terminate_calls"] == calls

    # Ended ten minutes ago and still refused: the next try is a minute away, not more.
    Pod.objects.filter(pk=pod.pk).update(
        step_at=timezone.now(), ended_at=timezone.now() - timezone.timedelta(minutes=10)
    )
    before = timezone.now()
    passes.pass_run()
    after = timezone.now()
    pod.refresh_from_db()
    assert before + timezone.timedelta(seconds=60) <= pod.step_at <= after + timezone.timedelta(seconds=60)
    assert sim.stats()["terminate_calls"] > calls

    sim.set_faults([])
    Pod.objects.filter(pk=pod.pk).update(step_at=timezone.now())  # the back-off has passed
    passes.pass_run()

    pod.refresh_from_db()
    assert not pod.terminate_pending and pod.step_at is None and not _at_the_provider(pod)


def test_a_pod_the_provider_no_longer_has_counts_as_terminated(sim, pool):
    pod = _pod_at_the_provider(pool)
    RunPodProvider().terminate(pod.provider_id)  # gone behind our back
    lifecycle.pod_release(pod=pod, reason="test")

    passes.pass_run()

    pod.refresh_from_db()
    assert not pod.terminate_pending and pod.step_at is None


def test_a_lost_pod_or_one_never_created_is_not_terminated(sim, pool):
    lost = _pod_at_the_provider(pool)
    never_created = Pod.objects.create(pool=pool, name=pod_name(pool, "nocreate"), state=Pod.State.BOOTING)

    lifecycle.pod_end(pod=lost, state=Pod.State.LOST, error="the provider no longer has this pod")
    lifecycle.pod_release(pod=never_created, reason="test")

    assert Pod.objects.filter(terminate_pending=True).count() == 0
    assert lifecycle.terminations_due(now=timezone.now(), limit=10) == []
