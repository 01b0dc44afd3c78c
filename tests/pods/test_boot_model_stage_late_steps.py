"""A boot whose model-stage steps come late (a long pass, a loaded machine) still joins."""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from pods.models import Pod
from pods.services import boot
from tests.pods.helpers import new_pod


def test_a_boot_whose_steps_each_come_a_window_late_asks_its_pod_and_joins(sim, pool, settings):
    pod = new_pod(pool)
    while (pod := Pod.objects.get(pk=pod.pk)).boot_stage != Pod.BootStage.MODEL:
        assert pod.state == Pod.State.BOOTING, pod.error
        Pod.objects.filter(pk=pod.pk).update(step_at=timezone.now())
        boot.boot_step(pod.pk)
    late = timedelta(seconds=settings.POD_POLL_SECONDS * boot.PROVIDER_CHECK_POLLS * 3)
    calls = sim.stats()["graphql_calls"]

    for _ in range(boot.PROVIDER_CHECK_POLLS):
        # Each step comes three windows of provider checks after the last (the pass that runs it
        # took that long): its stage began that much earlier, its step was due that long ago.
        pod = Pod.objects.get(pk=pod.pk)
        if pod.state != Pod.State.BOOTING:
            break
        Pod.objects.filter(pk=pod.pk).update(
            stage_started_at=pod.stage_started_at - late, step_at=timezone.now() - late
        )
        boot.boot_step(pod.pk)

    pod.refresh_from_db()
    # Steps timed in windows asked the provider each time, never the pod: it never joined.
    assert pod.state == Pod.State.READY, (pod.state, pod.boot_stage, pod.error)
    assert sim.stats()["graphql_calls"] - calls <= 1  # one step in a few asks the provider
