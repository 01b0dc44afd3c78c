"""The forecast against what bench/storm.py measured (issue 26): it prices the pool's pods at what
its last pods were billed, not the catalogue's cheapest (which may have no capacity), and its
minutes wait for a boot from the scaler's decision, not from the provider's create; a job behind
other pages of its pool waits for them and shares their pods' bill."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

from django.utils import timezone

from ocrjobs.models import Job, Page
from pods.models import Pod
from pods.services.forecast import pool_forecast
from tests.ocrjobs.test_forecast import gpu_pool  # noqa: F401 (a fixture: $0.50/h in the catalogue)


def make_booted(pool, *, decided, created, ready, price: str) -> Pod:
    return Pod.objects.create(pool=pool, name=f"p-{Pod.objects.count()}", state=Pod.State.TERMINATED, lanes=2,
                              cost_per_hr=Decimal(price), created_at=decided, billed_from=created,
                              ready_at=ready, ended_at=ready + timedelta(seconds=60))  # fmt: skip


def test_the_forecast_prices_a_pod_at_what_the_pools_last_pods_were_billed(gpu_pool):  # noqa: F811
    # The catalogue's cheapest candidate is $0.50/h; the boots found capacity only at $0.80/h.
    t0 = timezone.now() - timedelta(minutes=10)
    for n in range(2):
        start = t0 + timedelta(minutes=n)
        make_booted(gpu_pool, decided=start, created=start, ready=start + timedelta(seconds=60), price="0.80")

    forecast = pool_forecast(gpu_pool, pages=100)

    assert forecast["based_on"]["price_per_pod_hour"] == 0.8
    assert "last 2 pods" in forecast["based_on"]["prices"]["source"]
    # cheapest: one pod, 60 s boot + 100 s of pages + 60 s idle, at $0.80/h.
    assert forecast["sizings"]["cheapest"]["dollars"] == round(0.8 * 220 / 3600, 4)


def test_the_forecasts_minutes_wait_for_a_boot_from_the_scalers_decision(gpu_pool):  # noqa: F811
    # Each pod: decided at t, created at the provider 20 s later (candidates without capacity
    # tried first), ready 10 s after that: a job waits 30 s, the pool pays 10 s of boot.
    t0 = timezone.now() - timedelta(minutes=10)
    for n in range(3):
        start = t0 + timedelta(minutes=n)
        make_booted(gpu_pool, decided=start, created=start + timedelta(seconds=20),
                    ready=start + timedelta(seconds=30), price="0.50")  # fmt: skip

    forecast = pool_forecast(gpu_pool, pages=100)

    based = forecast["based_on"]
    assert based["boot_seconds"] == 10.0 and based["boot_wait_seconds"] == 30.0
    cheapest = forecast["sizings"]["cheapest"]  # one pod of 2 lanes: 100 pages × 2 s guessed = 100 s
    assert cheapest["minutes"] == round((30 + 100) / 60, 2)
    assert cheapest["dollars"] == round(0.5 * (10 + 100 + 60) / 3600, 4)  # billed from the create


def test_a_job_behind_other_pages_waits_for_them_and_shares_their_pods(gpu_pool, ordinary_user):  # noqa: F811
    # 300 pages of another job wait in the pool: they are read first, on the pods sized for all 400.
    other = Job.objects.create(owner=ordinary_user, pool=gpu_pool)
    document = other.documents.create(position=0, name="d.pdf", kind="pdf", source="x", size_bytes=1,
                                      page_count=300)  # fmt: skip
    Page.objects.bulk_create([Page(job=other, document=document, pool=gpu_pool, number=n) for n in range(1, 301)])

    forecast = pool_forecast(gpu_pool, pages=100)

    assert forecast["based_on"]["pages_ahead"] == 300
    cheapest = forecast["sizings"]["cheapest"]  # one 2-lane pod: 60 s boot, then 400 pages × 2 s ÷ 2 lanes
    assert cheapest["minutes"] == round((60 + 400) / 60, 2)
    # The pod's bill (boot, 400 s of pages, 60 s idle) shared by the pages: this job's quarter.
    assert cheapest["dollars"] == round(0.5 * (60 + 400 + 60) / 3600 / 4, 4)
    assert pool_forecast(gpu_pool, pages=100, ahead=0)["sizings"]["cheapest"]["minutes"] == round(160 / 60, 2)
