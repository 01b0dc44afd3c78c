"""Reconcile reads the database before it lists the provider's pods: a pod that a boot creates and
saves while reconcile runs is never taken for lost (and ended, then terminated as a stray: a boot
paid for and thrown away)."""

from __future__ import annotations

import uuid

from pods.models import Pod, pod_name
from pods.providers.base import Offer, PodSpec
from pods.providers.runpod import RunPodProvider
from pods.services import reconcile
from tests.pods.conftest import GOOD


def test_a_pod_created_and_saved_while_reconcile_runs_is_not_lost(sim, pool, settings, monkeypatch):
    settings.RECONCILE_GRACE_SECONDS = 60
    real_list, born = RunPodProvider.list, []

    def list_then_a_boot_saves_its_pod(provider, prefix=""):
        listed = real_list(provider, prefix=prefix)
        if not born:  # a boot step on another worker: create at the provider, save the row
            name = pod_name(pool, uuid.uuid4().hex[:8])
            created = provider.create(PodSpec(name=name, lanes=1, offer=Offer(GOOD, "SECURE", "EU-RO-1"), image="i:1"))
            born.append(Pod.objects.create(pool=pool, name=name, lanes=1, provider_id=created.provider_id,
                                           state=Pod.State.BOOTING))  # fmt: skip
        return listed

    monkeypatch.setattr(RunPodProvider, "list", list_then_a_boot_saves_its_pod)
    result = reconcile.reconcile(provider_name="runpod")
    assert result.lost == [] and born
    assert Pod.objects.get(pk=born[0].pk).state == Pod.State.BOOTING
    again = reconcile.reconcile(provider_name="runpod")  # the next pass sees it at the provider
    assert (again.lost, again.terminated) == ([], [])
    assert Pod.objects.get(pk=born[0].pk).state == Pod.State.BOOTING
