"""A dispatcher whose interruptible pod was preempted: it asks the provider at once, instead of
failing pages on the pod until it drains it and leaving the preemption to the scaler's next tick."""

from __future__ import annotations

import uuid
from decimal import Decimal

import pytest
from django.db.models import Sum
from django.utils import timezone

from ocrjobs.dispatch import loop as dispatch
from ocrjobs.models import Page
from pods.models import Pod, Pool, new_pod_token
from pods.providers.base import Offer, PodSpec
from pods.providers.runpod import RunPodProvider
from runpodsim import SimConfig, SimulatorThread
from runpodsim.config import GpuTypeConfig
from tests.factories import pdf_bytes
from tests.ocrjobs.helpers import run_dispatch_loop, split, submit
from tests.runpod import use_simulator


@pytest.fixture
def spot_pod(monkeypatch, settings, transactional_db):
    """A pool whose one ready pod is an interruptible pod on the RunPod simulator."""
    config = SimConfig(api_key="k", boot_delay_s=0, model_load_s=0, page_latency_s=0.05, default_lanes=2,
                       gpu_types=[GpuTypeConfig(id="S", display_name="s", secure_price=1.0, minimum_bid_price=0.2,
                                                capacity={"SECURE": {"DC": 1}})])  # fmt: skip
    with SimulatorThread(config) as sim:
        use_simulator(sim, monkeypatch, settings, api_key="k")
        pool = Pool.objects.create(key="spot", provider="runpod", max_pods=1, lanes_per_pod=2)
        token = new_pod_token()
        offer = Offer("S", "SECURE", "DC", cost_per_hr=Decimal("0.25"), interruptible=True, min_bid=Decimal("0.2"))
        spec = PodSpec(name=f"t{uuid.uuid4().hex[:6]}-spot-0", lanes=2, offer=offer, image="i:1",
                       env={"POD_TOKEN": token})  # fmt: skip
        created = RunPodProvider(api_key="k", url_template=sim.pod_url_template).create(spec)
        pod = Pod.objects.create(
            pool=pool, name=created.name, provider_id=created.provider_id, lanes=2, state=Pod.State.READY,
            base_url=sim.pod_url_template.format(pod_id=created.provider_id, port=8000), ready_at=timezone.now(),
            billed_from=timezone.now(), token=token, interruptible=True, cost_per_hr=Decimal("0.25"),
        )  # fmt: skip
        yield sim, pod


def test_a_preempted_pod_is_recorded_by_the_dispatcher_at_its_first_failure_and_its_pages_wait_unspent(
    spot_pod, ordinary_user, monkeypatch
):
    sim, pod = spot_pod
    monkeypatch.setattr(dispatch, "NO_POD_EXIT_SECONDS", 0.5)  # the loop ends once it has no pod
    job = submit(ordinary_user, {"report.pdf": pdf_bytes([["a page"]] * 6)}, pool_key=pod.pool.key)
    split(job)
    sim.preempt(pod.provider_id)

    run_dispatch_loop(pod.pool)

    # No reconcile ran: the dispatcher asked the provider when the pod answered 502 and recorded the
    # preemption itself. Before, it failed pages on the pod until it drained it (5 failures), and
    # the pod stayed alive (draining) until the scaler's next tick reconciled.
    pod.refresh_from_db()
    assert (pod.state, pod.preempted_at is not None) == (Pod.State.FAILED, True), pod.error
    pages = Page.objects.filter(job=job)
    assert set(pages.values_list("status", flat=True)) == {Page.Status.PENDING}
    spent = pages.aggregate(n=Sum("attempts") - Sum("attempts_given_back"))["n"]
    assert spent == 0  # every attempt the preemption cost was given back
    assert sim.stats()["pods_preempted"] == 1
