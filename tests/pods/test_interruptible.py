"""Interruptible (spot) RunPod pods: bids, the on-demand floor, preemptions, and what they cost."""

from __future__ import annotations

import uuid
from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone
from runpod.api.mutations import pods as pod_mutations

from ocrjobs.models import Document, Job, Page
from pods import capacity, planning
from pods.models import Pod, Pool, SpendEntry, pod_name
from pods.poolconfig import PoolConfigError, parse_config
from pods.providers import runpod_api
from pods.providers.base import Offer, PodSpec
from pods.providers.runpod import UnsafeValue, interruptible_query
from pods.services import forecast, preemption, reconcile, scaler
from runpodsim import SimConfig
from runpodsim.config import GpuTypeConfig
from tests.pods.conftest import GOOD, KEY, simulated
from tests.pods.helpers import boot_until_settled
from tests.pods.test_deadlines import _job_with, in_seconds

SPOT = "NVIDIA SPOT 3"
IMAGE = "ghcr.io/example/fleetadmin-pod:1"


@pytest.fixture
def spot_sim(monkeypatch, settings):
    """GOOD: on-demand only, $0.30/h; SPOT: $0.50/h on demand, rented from a minimum bid of $0.12/h."""
    config = SimConfig(
        api_key=KEY,
        boot_delay_s=0.05,
        model_load_s=0.05,
        page_latency_s=0.01,
        gpu_types=[
            GpuTypeConfig(id=GOOD, display_name="good", secure_price=0.30, capacity={"SECURE": {"EU-RO-1": 4}}),
            GpuTypeConfig(
                id=SPOT,
                display_name="spot",
                secure_price=0.50,
                minimum_bid_price=0.12,
                capacity={"SECURE": {"EU-RO-1": 4}},
            ),  # fmt: skip
        ],
    )
    with simulated(config, monkeypatch, settings) as simulator:
        yield simulator


def spot_pool(key: str = "spot", **config) -> Pool:
    return Pool.objects.create(
        key=key,
        provider="runpod",
        max_pods=4,
        lanes_per_pod=2,
        config={
            "image": IMAGE,
            "candidates": [
                {"gpu_types": [SPOT], "cloud_type": "SECURE", "interruptible": True, "bid_margin": "0.03"},
                {"gpu_types": [GOOD], "cloud_type": "SECURE"},
            ],
            **config,
        },
    )


def new_pod(pool: Pool) -> Pod:
    return Pod.objects.create(pool=pool, name=pod_name(pool, uuid.uuid4().hex[:8]), lanes=pool.lanes_per_pod)


def pages_on(pod: Pod, count: int) -> list[Page]:
    job = Job.objects.create(pool=pod.pool, status=Job.Status.RUNNING)
    document = Document.objects.create(job=job, position=0, name="d.pdf", kind="pdf", source="x", sha256="0" * 64,
                                       size_bytes=1, page_count=count, status="split")  # fmt: skip
    return [Page.objects.create(job=job, document=document, pool=pod.pool, number=n + 1) for n in range(count)]


# -- the bid and the mutation ------------------------------------------------------------------------


def test_the_bid_is_the_minimum_bid_plus_the_margin_capped_at_the_on_demand_price():
    spot = Offer(SPOT, "SECURE", interruptible=True, bid_margin=Decimal("0.03"))
    on_demand = Offer(GOOD, "SECURE")
    catalogue = [
        Offer(SPOT, "SECURE", cost_per_hr=Decimal("0.50"), min_bid=Decimal("0.12")),
        Offer(GOOD, "SECURE", cost_per_hr=Decimal("0.30")),
    ]
    priced = planning.priced([on_demand, spot], catalogue)
    assert [(o.gpu_type, o.interruptible, o.cost_per_hr) for o in priced] == [
        (SPOT, True, Decimal("0.15")),
        (GOOD, False, Decimal("0.30")),
    ]
    greedy = Offer(SPOT, "SECURE", interruptible=True, bid_margin=Decimal("5"))
    assert planning.priced([greedy], catalogue)[0].cost_per_hr == Decimal("0.50")  # never over on-demand
    unbid = Offer(GOOD, "SECURE", interruptible=True)  # the catalogue names no minimum bid for it
    assert planning.priced([unbid], catalogue) == []


def test_the_mutation_carries_checked_values_and_refuses_what_the_sdk_would_paste_unescaped():
    offer = Offer(SPOT, "SECURE", "EU-RO-1", cost_per_hr=Decimal("0.15"), interruptible=True)
    query = interruptible_query(PodSpec(name="fa-1", lanes=2, offer=offer, image=IMAGE, env={"A": "b"}))
    assert "podRentInterruptable(input:" in query and "bidPerGpu: 0.15," in query
    assert f'gpuTypeId: "{SPOT}"' in query and 'dataCenterId: "EU-RO-1"' in query
    assert '{key: "A", value: "b"}' in query
    with pytest.raises(UnsafeValue, match="env value of A"):
        interruptible_query(PodSpec(name="fa-1", lanes=2, offer=offer, image=IMAGE, env={"A": 'x", bidPerGpu: 9'}))
    for bad in (Decimal("0"), Decimal("-1"), Decimal("NaN"), Decimal("5000")):
        cheap = Offer(SPOT, "SECURE", cost_per_hr=bad, interruptible=True)
        with pytest.raises(UnsafeValue, match="bid per GPU"):
            interruptible_query(PodSpec(name="fa-1", lanes=2, offer=cheap, image=IMAGE))


def test_a_pool_config_refuses_a_negative_margin_or_floor():
    base = {"image": IMAGE, "candidates": [{"gpu_types": [SPOT], "interruptible": True}]}
    assert parse_config("runpod", base).has_interruptible
    with pytest.raises(PoolConfigError, match="bid_margin"):
        parse_config("runpod", {**base, "candidates": [{"gpu_types": [SPOT], "bid_margin": "-1"}]})
    with pytest.raises(PoolConfigError, match="on_demand_floor"):
        parse_config("runpod", {**base, "on_demand_floor": -1})


# -- boots ------------------------------------------------------------------------------------------


def test_a_boot_rents_the_interruptible_candidate_at_its_bid(spot_sim, db):
    pool = spot_pool()
    pod = boot_until_settled(new_pod(pool).pk)
    assert pod.state == Pod.State.READY, pod.error
    assert (pod.gpu_type, pod.interruptible, pod.cost_per_hr) == (SPOT, True, Decimal("0.1500"))
    [listed] = spot_sim.pods()
    assert listed["interruptible"] and listed["cost_per_hr"] == pytest.approx(0.15)
    assert spot_sim.stats()["interruptible_create_calls"] == 1


def test_an_on_demand_floor_is_kept_and_the_pods_above_it_are_interruptible(spot_sim, db):
    pool = spot_pool(on_demand_floor=1)
    first = boot_until_settled(new_pod(pool).pk)
    second = boot_until_settled(new_pod(pool).pk)
    assert (first.gpu_type, first.interruptible) == (GOOD, False)
    assert (second.gpu_type, second.interruptible) == (SPOT, True)


# -- preemption --------------------------------------------------------------------------------------


def test_a_preempted_pod_ends_at_the_preemption_its_pages_wait_again_without_spending_an_attempt(spot_sim, db):
    pool = spot_pool()
    pod = boot_until_settled(new_pod(pool).pk)
    running, failed_there, elsewhere = pages_on(pod, 3)
    Page.objects.filter(pk=running.pk).update(status=Page.Status.RUNNING, pod=pod, attempts=1, claim_token="t")
    # The dispatcher saw the pod vanish first: that attempt failed and the page waits.
    Page.objects.filter(pk=failed_there.pk).update(
        status=Page.Status.PENDING, failed_on_pod=pod, attempts=2, error="HTTP 502"
    )
    Page.objects.filter(pk=elsewhere.pk).update(status=Page.Status.PENDING, attempts=1)
    spot_sim.preempt(pod.provider_id)
    result = reconcile.reconcile(provider_name="runpod")
    assert result.preempted == [pod.name] and result.lost == []
    pod.refresh_from_db()
    assert pod.state == Pod.State.FAILED and pod.preempted_at is not None and pod.ended_at == pod.preempted_at
    assert pod.terminate_pending  # stopped, not gone: it is terminated there
    attempts = dict(Page.objects.values_list("pk", "attempts"))
    assert attempts == {running.pk: 0, failed_there.pk: 1, elsewhere.pk: 1}
    assert set(Page.objects.values_list("status", flat=True)) == {Page.Status.PENDING}
    # Spend runs to the preemption, not to when it was noticed.
    billed = (pod.preempted_at - pod.billed_from).total_seconds()
    total = sum(SpendEntry.objects.filter(pod=pod).values_list("dollars", flat=True))
    assert float(total) == pytest.approx(0.15 * billed / 3600, abs=1e-6)
    # Every boot skips the candidate for a while: the next one rents on demand.
    assert capacity.blocked_keys([f"runpod|{SPOT}|SECURE|*|spot"]) == {f"runpod|{SPOT}|SECURE|*|spot"}
    assert boot_until_settled(new_pod(pool).pk).gpu_type == GOOD


def test_a_preemption_is_recorded_once_whoever_notices(spot_sim, db):
    pool = spot_pool()
    pod = boot_until_settled(new_pod(pool).pk)
    assert preemption.pod_preempted(pod=pod)
    assert not preemption.pod_preempted(pod=pod)
    assert Pod.objects.get(pk=pod.pk).state == Pod.State.FAILED


def test_an_on_demand_pod_the_provider_stops_is_not_taken_for_preempted(spot_sim, db):
    pool = spot_pool()
    Pool.objects.filter(pk=pool.pk).update(config={**pool.config, "candidates": [{"gpu_types": [GOOD]}]})
    pod = boot_until_settled(new_pod(Pool.objects.get(pk=pool.pk)).pk)
    runpod_api.graphql(pod_mutations.generate_pod_stop_mutation(pod.provider_id), api_key=KEY)  # "Stopped by User"
    assert reconcile.reconcile(provider_name="runpod").preempted == []
    assert Pod.objects.get(pk=pod.pk).state == Pod.State.READY


# -- what the scaler and the forecast count ----------------------------------------------------------


def _spot_history(pool: Pool, *, hours: float, preempted: int, pods: int) -> None:
    now = timezone.now()
    for n in range(pods):
        Pod.objects.create(
            pool=pool, name=f"old-{n}", interruptible=True, state=Pod.State.FAILED if n < preempted else "terminated",
            billed_from=now - timedelta(hours=hours), ended_at=now, preempted_at=now if n < preempted else None,
            cost_per_hr=Decimal("0.15"),
        )  # fmt: skip


def test_preemptions_are_counted_per_pod_hour_over_the_pools_last_hours(db):
    pool = spot_pool()
    _spot_history(pool, hours=2, preempted=1, pods=5)  # 10 pod-hours, one preemption
    rate = preemption.preemption_rate(pool)
    assert (rate.preemptions, rate.pod_hours) == (1, pytest.approx(10, rel=1e-3))
    assert rate.per_pod_hour == pytest.approx(0.1, rel=1e-3)
    assert preemption.preemption_rate(pool, hours=1).pod_hours == pytest.approx(5, rel=1e-3)
    assert scaler.preemption_overhead(pool, 2.0) > 1.0
    assert scaler.preemption_overhead(Pool.objects.create(key="none", provider="local"), 2.0) == 1.0


def test_the_forecast_prices_interruptible_pods_at_their_bid_and_counts_preemptions(spot_sim, db):
    pool = spot_pool()
    capacity.catalogue_get("runpod")
    calm = forecast.pool_forecast(pool, pages=2000)
    assert calm["based_on"]["price_per_pod_hour"] == pytest.approx(0.15)
    assert calm["based_on"]["preemptions"]["per_pod_hour"] == 0
    _spot_history(pool, hours=1, preempted=3, pods=3)  # every pod preempted within its hour
    stormy = forecast.pool_forecast(pool, pages=2000)
    for sizing in forecast.SIZINGS:
        assert stormy["sizings"][sizing]["preemptions"] > 0
        assert stormy["sizings"][sizing]["dollars"] > calm["sizings"][sizing]["dollars"]
        assert stormy["sizings"][sizing]["minutes"] > calm["sizings"][sizing]["minutes"]
    floored = spot_pool("floored", on_demand_floor=4)
    on_demand = forecast.pool_forecast(floored, pages=2000)["sizings"]["fastest"]
    assert on_demand["dollars"] > stormy["sizings"]["fastest"]["dollars"]  # every pod at $0.30, not $0.15


# -- a deadline interruptible pods would put at risk ---------------------------------------------------


def test_a_deadline_without_room_for_a_preemption_moves_the_rest_to_on_demand_pods(spot_sim, db, settings):
    settings.SCALE_SECONDS_PER_PAGE_GUESS = 2.0
    settings.SCALE_BOOT_SECONDS_GUESS = 60.0
    pool = spot_pool()
    _job_with(pool, 200, deadline=in_seconds(3600))  # 400 lane-s on up to 4 two-lane pods: an hour is ample
    assert not scaler.pool_demand(pool).on_demand_only
    Job.objects.update(deadline=in_seconds(125))  # met by 4 pods after a 60 s boot, but not after a second one
    demand = scaler.pool_demand(pool)
    assert demand.on_demand_only and not demand.missed_deadline
    result = scaler.pool_tick(pool=pool)
    booted = Pod.objects.filter(pk__in=result.booted)
    assert booted.count() == 4 and all(booted.values_list("on_demand_only", flat=True))
    assert boot_until_settled(booted.first().pk).gpu_type == GOOD  # not the cheaper bid
    on_demand = Pool.objects.create(key="od", provider="runpod", max_pods=4, lanes_per_pod=2,
                                    config={"image": IMAGE, "candidates": [{"gpu_types": [GOOD]}]})  # fmt: skip
    _job_with(on_demand, 200, deadline=in_seconds(125))
    assert not scaler.pool_demand(on_demand).on_demand_only  # nothing interruptible to move away from


def test_a_preempted_pod_is_replaced_while_pages_wait_not_forgone_for_the_work_left(db, settings):
    settings.SCALE_SECONDS_PER_PAGE_GUESS = 1.0
    pool = spot_pool()  # up to 4 pods of 2 lanes
    pods = [new_pod(pool) for _ in range(3)]
    Pod.objects.filter(pk__in=[pod.pk for pod in pods]).update(state=Pod.State.READY, interruptible=True)
    pages_on(pods[0], 4)  # little work left: sized from now, one pod would do
    assert scaler.pool_demand(pool).wanted == 1
    preemption.pod_preempted(pod=pods[0])
    preemption.pod_preempted(pod=pods[1])
    # The fleet the pool had when they were preempted, not the one pod the work left wants; but no
    # more pods than the waiting pages fill (4 pages, 2 lanes a pod).
    assert scaler.pool_demand(pool).wanted == 2
    pages_on(pods[2], 8)
    assert scaler.pool_demand(pool).wanted == 3
    Page.objects.update(status=Page.Status.DONE)
    assert scaler.pool_demand(pool).wanted == 0  # nothing waits: nothing held
