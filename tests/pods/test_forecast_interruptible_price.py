"""An interruptible pool's forecast prices its pods at the bids its last interruptible pods were
billed, and its on-demand floor at what its last on-demand pods were billed: the catalogue's
cheapest bid may be a GPU type with no capacity (bench/storm.py --interruptible: its cheapest
types have none anywhere; the pods ran at the next type's bid)."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from pods import capacity
from pods.models import Pod
from pods.services import forecast
from tests.pods import test_interruptible

spot_sim = test_interruptible.spot_sim  # a fixture: the bid on SPOT is $0.12 + the pool's $0.03 margin


def billed(pool, *, price: str, interruptible: bool) -> None:
    start = timezone.now() - timedelta(minutes=10)
    Pod.objects.create(pool=pool, name=f"p-{Pod.objects.count()}", state=Pod.State.TERMINATED, lanes=2,
                       interruptible=interruptible, cost_per_hr=Decimal(price), created_at=start,
                       billed_from=start, ready_at=start + timedelta(seconds=10),
                       ended_at=start + timedelta(minutes=2))  # fmt: skip


def test_an_interruptible_pool_is_priced_at_its_last_pods_bids_not_the_catalogues_cheapest(spot_sim, db):
    pool = test_interruptible.spot_pool()
    capacity.catalogue_get("runpod")
    fresh = forecast.pool_forecast(pool, pages=2000)
    billed(pool, price="0.25", interruptible=True)  # the bids that got pods: a dearer type's
    billed(pool, price="0.27", interruptible=True)
    billed(pool, price="0.90", interruptible=False)  # an on-demand pod (no bid got one then): not a bid
    forecast._bases.clear()

    measured = forecast.pool_forecast(pool, pages=2000)

    assert fresh["based_on"]["price_per_pod_hour"] == pytest.approx(0.15)  # the catalogue's bid
    assert measured["based_on"]["price_per_pod_hour"] == pytest.approx(0.26)
    assert measured["based_on"]["prices"]["source"] == "the pool's last 2 interruptible pods' bids"
    based = measured["based_on"]  # cheapest: one pod's boot, 2000 pages × 2 s (guessed) ÷ 2 lanes, idle tail
    billed_seconds = based["boot_seconds"] + 2000 + based["idle_seconds"]
    assert measured["sizings"]["cheapest"]["dollars"] == pytest.approx(0.26 * billed_seconds / 3600, abs=1e-4)


def test_an_interruptible_pools_on_demand_floor_is_priced_at_its_last_on_demand_pods(spot_sim, db):
    floored = test_interruptible.spot_pool("floored", on_demand_floor=4)  # every pod of max_pods on demand
    capacity.catalogue_get("runpod")
    billed(floored, price="0.60", interruptible=False)
    forecast._bases.clear()

    measured = forecast.pool_forecast(floored, pages=2000)
    based, fastest = measured["based_on"], measured["sizings"]["fastest"]

    # fastest: four on-demand pods (the floor), each its boot, 500 pages × 2 s ÷ 2 lanes, idle tail:
    # at the pool's last on-demand pod's $0.60/h, not the catalogue's $0.30/h.
    per_pod = based["boot_seconds"] + 500 + based["idle_seconds"]
    assert fastest["pods"] == 4
    assert fastest["dollars"] == pytest.approx(4 * 0.60 * per_pod / 3600, abs=1e-4)
