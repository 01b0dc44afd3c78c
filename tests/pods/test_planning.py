"""The sizing plan and the boot's candidate ranking on plain values (pods/planning.py), as Ray's
autoscaler tests are: no rows to check 20 × 2 / (2 × 10) = 2. One test shows the forecast's pods
are the tick's."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from ocrjobs.models import Job
from pods.planning import (
    BOOTING,
    DEMAND,
    DRAINING,
    READY,
    WARM,
    PodView,
    Policy,
    PoolSnapshot,
    ScheduledJob,
    Stop,
    candidates,
    plan,
    preemption_overhead,
    size,
    to_try,
    waits_for_cheaper,
)
from pods.providers.base import Offer
from pods.services import forecast, scaler
from tests.pods.test_pod_services import _pages
from tools.processes import REPO

NOW = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)
TARGET_ONLY = Policy(target_seconds=10, max_overhead=0.0)


def ago(seconds: float) -> datetime:
    return NOW - timedelta(seconds=seconds)


def pool(**fields) -> PoolSnapshot:
    """Two-lane pods, up to 10, 2 s a page, 60 s boots and idle tails."""
    return PoolSnapshot(now=NOW, **fields)


def test_demand_is_pages_waiting_times_seconds_per_page_over_lanes():
    assert size(pool(waiting=20), TARGET_ONLY).wanted == 2  # 20 × 2 s / (2 lanes × 10 s)
    assert size(pool(waiting=10, seconds_per_page=4.0), TARGET_ONLY).wanted == 2  # 10 × 4 s / (2 × 10 s)
    assert size(pool(waiting=10, running=10), TARGET_ONLY).wanted == 2  # running pages are work too


def test_the_cost_cap_wants_no_more_pods_than_the_work_pays_for():
    capped = Policy(target_seconds=10, max_overhead=0.1)
    shape = {"boot_seconds": 30.0, "idle_seconds": 10.0, "max_pods": 50}
    # 200 pod-seconds of work; each pod costs 40 s beyond its pages; 10 % of it pays for half a pod.
    sized = size(pool(waiting=200, **shape), capped)
    assert (sized.affordable, sized.wanted) == (0, 1)  # pages wait: one pod all the same
    sized = size(pool(waiting=2000, **shape), capped)  # 2,000 pod-seconds pay for 5 pods
    assert (sized.affordable, sized.wanted) == (5, 5)
    assert size(pool(waiting=2000, **shape), TARGET_ONLY).wanted == 50  # off: the time target alone


def test_the_floor_and_max_pods_bound_what_the_work_wants():
    assert size(pool(floor=2), TARGET_ONLY).wanted == 2  # nothing waits: the floor is kept
    assert size(pool(waiting=1000, max_pods=3), TARGET_ONLY).wanted == 3
    assert size(pool(), TARGET_ONLY).wanted == 0


def test_fastest_uses_every_lane_the_pages_can_fill_and_cheapest_one_pod():
    fastest = size(pool(waiting=20, pages_not_split=10, jobs=(ScheduledJob(1, None, "fastest"),)), TARGET_ONLY)
    assert (fastest.wanted, fastest.sized_for) == (10, "fastest")  # 30 pages over 2 lanes, max pods 10
    fastest = size(pool(waiting=6, pages_not_split=4, jobs=(ScheduledJob(1, None, "fastest"),)), TARGET_ONLY)
    assert fastest.wanted == 5  # the pages not split yet count too
    cheapest = size(pool(waiting=100, jobs=(ScheduledJob(1, None, "cheapest"),)), TARGET_ONLY)
    assert (cheapest.wanted, cheapest.sized_for) == (1, "cheapest")
    mixed = (ScheduledJob(1, None, "cheapest"), ScheduledJob(2, None, "balanced"))
    assert size(pool(waiting=100, jobs=mixed), TARGET_ONLY).wanted == 10  # one job asks for balanced


def test_a_deadline_sizes_for_its_work_after_a_boot_and_says_when_it_cannot_be_met():
    slow = Policy(target_seconds=3600, max_overhead=0.0)
    due = ScheduledJob(7, NOW + timedelta(seconds=600), "balanced")
    # 2,000 lane-seconds in 600 s, each pod working after its 60 s boot: 2,000 / (2 × 540) → 2 pods.
    met = size(pool(waiting=1000, jobs=(due,)), slow)
    assert (met.wanted, met.sized_for, met.missed_deadline) == (2, "deadline of job 7", "")
    missed = size(pool(waiting=1000, max_pods=1, jobs=(due,)), slow)
    assert missed.wanted == 1
    earliest = (NOW + timedelta(seconds=(2000 + 2 * 60) / 2)).isoformat(timespec="seconds")
    assert "job 7's deadline" in missed.missed_deadline and missed.missed_deadline.endswith(earliest)
    # 2,200 lane-s: 3 pods after their boots; a ready pod works from now, 2 × 600 of it: 1 + 1,000 / 1,080.
    assert size(pool(waiting=1100, jobs=(due,)), slow).wanted == 3
    assert size(pool(waiting=1100, jobs=(due,), pods=(PodView(1, READY),)), slow).wanted == 2


def test_a_deadline_interruptible_pods_would_put_at_risk_rents_on_demand():
    slow = Policy(target_seconds=3600, max_overhead=0.0)
    due = ScheduledJob(7, NOW + timedelta(seconds=600), "balanced")
    # 2,000 lane-s want 2 of 2 pods; a preemption on each adds a boot and half a page a lane (2 × 122).
    tight = pool(waiting=1000, max_pods=2, jobs=(due,))
    assert size(tight, slow).wanted == 2 and not size(tight, slow).on_demand_only  # nothing interruptible
    assert size(PoolSnapshot(**{**vars(tight), "rents_interruptible": True}), slow).on_demand_only
    roomy = pool(waiting=1000, max_pods=3, rents_interruptible=True, jobs=(due,))
    assert not size(roomy, slow).on_demand_only  # a third pod has room for the preemptions


def test_a_preempted_pod_is_replaced_while_pages_wait_and_preemptions_add_their_redo():
    assert size(pool(waiting=10, fleet_before_preemption=4), TARGET_ONLY).wanted == 4
    assert size(pool(waiting=2, fleet_before_preemption=4), TARGET_ONLY).wanted == 1  # no more than pages fill
    assert size(pool(fleet_before_preemption=4), TARGET_ONLY).wanted == 0  # nothing waits: nothing held
    assert preemption_overhead(0.0, seconds_per_page=2.0, boot_seconds=59.0) == 1.0
    assert preemption_overhead(0.5, seconds_per_page=2.0, boot_seconds=59.0) == pytest.approx(1 + 0.5 * 60 / 3600)
    # 2,000 lane-s want 100 pods at a 10 s target; one preemption a pod-hour adds 61 s in 3,600 of it.
    assert size(pool(waiting=1000, max_pods=500, preemptions_per_pod_hour=1.0), TARGET_ONLY).wanted == 102


def test_a_tick_boots_within_the_parallel_boot_cap_counting_booting_pods():
    fleet = (PodView(1, BOOTING), PodView(2, READY))
    planned = plan(pool(waiting=100, max_parallel_boots=3, pods=fleet), TARGET_ONLY)
    assert (planned.wanted, planned.serving, planned.boot, planned.boot_reason) == (10, 2, 2, DEMAND)
    assert plan(pool(floor=2), TARGET_ONLY).boot_reason == WARM


def test_a_guessed_page_time_grows_no_fleet_whose_ready_pods_are_about_to_measure_it():
    guessed = {"waiting": 40, "per_page_guessed": True}
    assert plan(pool(**guessed), TARGET_ONLY).boot == 4  # no pod ready: it boots on the guess
    assert plan(pool(**guessed, pods=(PodView(1, READY),)), TARGET_ONLY).boot == 0
    assert plan(pool(**guessed, floor=3, pods=(PodView(1, READY),)), TARGET_ONLY).boot == 2  # the floor is no guess
    assert plan(pool(waiting=40, pods=(PodView(1, READY),)), TARGET_ONLY).boot == 3  # measured: it grows


def test_a_stalled_pool_boots_nothing_and_raises_a_stall():
    stalled = pool(waiting=50, pods=(PodView(1, READY, ready_at=ago(120)),), last_start=ago(300))
    planned = plan(stalled, TARGET_ONLY)
    assert planned.boot == 0 and planned.blocked.startswith("dispatch stalled: 50 pages waiting, 2 lanes free")
    assert planned.alerts["stall"] == planned.blocked
    started = PoolSnapshot(**{**vars(stalled), "last_start": ago(5)})
    assert plan(started, TARGET_ONLY).boot == 4 and plan(started, TARGET_ONLY).alerts["stall"] == ""
    young = pool(waiting=50, pods=(PodView(1, READY, ready_at=ago(10)),))  # ready for less than STALL_SECONDS
    assert plan(young, TARGET_ONLY).alerts["stall"] == ""


def test_the_budget_cap_and_a_refusing_provider_block_boots_and_only_the_cap_alerts():
    over = pool(waiting=100, max_dollars_per_hour=Decimal("1.00"), dollars_per_hour=Decimal("0.80"),
                cheapest_per_hour=Decimal("0.30"))  # fmt: skip
    planned = plan(over, TARGET_ONLY)
    assert (
        planned.boot == 0
        and planned.alerts["budget"] == "budget cap: $0.80/h running + $0.30/h for one more is over $1.00/h"
    )
    under = PoolSnapshot(**{**vars(over), "cheapest_per_hour": Decimal("0.20")})
    assert plan(under, TARGET_ONLY).boot == 10 and plan(under, TARGET_ONLY).alerts["budget"] == ""
    refused = plan(pool(waiting=100, refused="the provider refused our credentials"), TARGET_ONLY)
    assert (refused.boot, refused.blocked, refused.alerts["budget"]) == (0, "the provider refused our credentials", "")
    assert plan(pool(refused="no"), TARGET_ONLY).blocked == ""  # nothing to boot: nothing blocked


def test_a_shed_stops_anticipatory_boots_first_newest_first_never_one_waiting_pages_need():
    fleet = (
        PodView(1, BOOTING, reason=DEMAND, created_at=ago(30)),
        PodView(2, BOOTING, reason=WARM, created_at=ago(20)),
        PodView(3, BOOTING, reason=DEMAND, created_at=ago(10)),
        PodView(4, BOOTING, reason=WARM, created_at=ago(40), cancel_requested=True),  # stopped already
    )
    assert plan(pool(pods=fleet), TARGET_ONLY).cancel == (Stop(2, "shed: no page needs this boot"),
                                                          Stop(3, "shed: no page needs this boot"),
                                                          Stop(1, "shed: no page needs this boot"))  # fmt: skip
    assert [stop.pod_id for stop in plan(pool(waiting=20, pods=fleet), TARGET_ONLY).cancel] == [2]  # 2 pods wanted


def test_a_shed_releases_idle_ready_pods_longest_idle_first_and_ticks_when_the_next_has_idled():
    fleet = (
        PodView(1, READY, last_busy_at=ago(10)),  # not idle for idle_seconds (60) yet
        PodView(2, READY, last_busy_at=ago(100)),
        PodView(3, READY, last_busy_at=None),  # never busy
        PodView(4, READY, last_busy_at=ago(200), busy=True),  # a page running: never released
        PodView(5, DRAINING),
        PodView(6, DRAINING, busy=True),
    )
    planned = plan(pool(pods=fleet), TARGET_ONLY)
    assert planned.release == (Stop(5, "drained"), Stop(3, "shed: idle"), Stop(2, "shed: idle"))
    assert planned.shed_tick_at == ago(10) + timedelta(seconds=60)
    forced = plan(pool(pods=fleet), Policy(target_seconds=10, max_overhead=0.0, force_shed=True))
    assert [stop.reason for stop in forced.release][-1] == "shed: scale request" and forced.shed_tick_at is None
    assert plan(pool(floor=4, pods=fleet), TARGET_ONLY).release == (Stop(5, "drained"),)  # the floor is kept


@pytest.mark.parametrize("priority", ["balanced", "fastest", "cheapest"])
def test_a_forecasts_pods_are_the_ticks_for_the_same_pool(pool_with_a_floor, priority):
    """The forecast of 600 pages alone, and the tick once they wait: the same pods, the floor, the
    cost cap and max pods included (forecast.pods_for once had a formula of its own without the floor)."""
    job = _pages(pool_with_a_floor, 600)[0].job
    Job.objects.filter(pk=job.pk).update(priority=priority)
    figures = forecast.pool_forecast(pool_with_a_floor, pages=600, ahead=0, serving=False)

    tick = scaler.pool_tick(pool=pool_with_a_floor)

    assert figures["sizings"][priority]["pods"] == tick.wanted == len(tick.booted)
    assert tick.wanted == {"balanced": 2, "fastest": 10, "cheapest": 2}[priority]


@pytest.fixture
def pool_with_a_floor(pool, settings):
    settings.SCALE_MAX_OVERHEAD = 0.12  # shipped: 1,200 lane-s pay for no pod's boot and idle tail
    settings.SCALE_TARGET_SECONDS = 120.0
    settings.SCALE_SECONDS_PER_PAGE_GUESS = 2.0
    settings.SCALE_BOOT_SECONDS_GUESS = 60.0
    pool.min_pods, pool.max_pods, pool.max_parallel_boots, pool.idle_seconds = 2, 10, 10, 60
    pool.save()
    return pool


CHEAP, DEAR, SPOT = "NVIDIA RTX A4000", "NVIDIA A40", "NVIDIA RTX A5000"
CATALOGUE = [
    Offer(CHEAP, "SECURE", cost_per_hr=Decimal("0.17")),
    Offer(DEAR, "SECURE", cost_per_hr=Decimal("0.40")),
    Offer(SPOT, "SECURE", cost_per_hr=Decimal("0.30"), min_bid=Decimal("0.10")),
]


def test_a_boot_walks_the_candidates_cheapest_first_each_with_its_key():
    offers = [Offer(DEAR, "SECURE", "EU-RO-1"), Offer("unlisted", "SECURE"), Offer(CHEAP, "SECURE", "US-KS-2"),
              Offer(SPOT, "SECURE", interruptible=True, bid_margin=Decimal("0.02"))]  # fmt: skip
    ranked = candidates(offers, CATALOGUE, provider="runpod", on_demand=False)
    assert [(offer.gpu_type, offer.cost_per_hr, key) for offer, key in ranked] == [
        (SPOT, Decimal("0.12"), f"runpod|{SPOT}|SECURE|*|spot"),  # its bid: the minimum and the margin
        (CHEAP, Decimal("0.17"), f"runpod|{CHEAP}|SECURE|US-KS-2"),
        (DEAR, Decimal("0.40"), f"runpod|{DEAR}|SECURE|EU-RO-1"),
        ("unlisted", Decimal("0"), "runpod|unlisted|SECURE|*"),  # no price known: last
    ]
    on_demand = candidates(offers, CATALOGUE, provider="runpod", on_demand=True)
    assert [offer.gpu_type for offer, _ in on_demand] == [CHEAP, DEAR, "unlisted"]


def test_a_walk_skips_what_every_boot_skips_and_what_it_tried():
    ranked = candidates([Offer(CHEAP, "SECURE"), Offer(DEAR, "SECURE")], CATALOGUE, provider="runpod", on_demand=False)
    cheap, dear = (key for _, key in ranked)
    assert to_try(ranked, blocked=set(), tried=set()) == ranked
    assert to_try(ranked, blocked={cheap}, tried=set()) == ranked[1:]  # "no capacity" lately
    assert to_try(ranked, blocked=set(), tried={dear}) == ranked[:1]
    assert to_try(ranked, blocked={cheap}, tried={dear}) == []


def test_a_boot_waits_for_a_cheaper_candidate_only_so_long_from_the_start_of_its_walk():
    assert waits_for_cheaper(ago(10), now=NOW, wait_seconds=20)
    assert waits_for_cheaper(ago(20), now=NOW, wait_seconds=20)
    assert not waits_for_cheaper(ago(21), now=NOW, wait_seconds=20)


def test_the_plan_imports_no_django_and_no_model():
    code = "import sys, pods.planning; print(sorted(m for m in sys.modules if m.startswith(('django', 'ocrjobs'))))"
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
