"""The fleet's part of ``GET /metrics`` (fleetadmin/metrics.py): pods, lanes, backlog, pages,
boots, capacity verdicts, alerts and spend, per pool. Registered from ``PodsConfig.ready()``;
the pages' figures come through ``pods.hooks``. A fixed handful of queries whatever the fleet.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal

from django.db.models import Count, Q
from django.utils import timezone
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from pods import hooks
from pods.models import Alert, BootAttemptTally, CapacityVerdict, Pod, Pool, PoolPodTally

NO_PAGES = {"done": 0, "failed": 0, "waiting": 0, "running": 0}


@dataclass
class PoolFigures:
    """Each pool's pods by state (the live ones and the ended ones' tally), its ready lanes and
    dollars: {pool id: …}."""

    states: dict[int, Counter] = field(default_factory=lambda: defaultdict(Counter))
    ready_lanes: Counter = field(default_factory=Counter)
    dollars_per_hour: dict[int, Decimal] = field(default_factory=lambda: defaultdict(Decimal))
    dollars: dict[int, Decimal] = field(default_factory=lambda: defaultdict(Decimal))


def fleet_metrics() -> Iterator[Metric]:
    """Every metric of the fleet, read now."""
    now = timezone.now()
    # Each pool with its ended pods' tally (a left join: one query).
    ended = (*PoolPodTally.ENDED_STATES, "dollars")
    rows = Pool.objects.values_list("pk", "key", *(f"pod_tally__{f}" for f in ended))
    pools = {row[0]: row[1] for row in rows}
    tallies = {row[0]: dict(zip(ended, row[2:], strict=True)) for row in rows}
    figures = pool_figures(tallies, now=now)
    yield from pool_metrics(pools, figures, hooks.jobs().pools_page_totals(now=now))
    yield from boot_metrics(pools, now=now)


def pool_figures(tallies: dict[int, dict], *, now: datetime) -> PoolFigures:
    """The live pods, and a tally of the ended ones kept as each ended: not every pod ever rented."""
    pods = Pod.objects.alive().only("pool_id", "state", "lanes", "cost_per_hr", "billed_from", "ended_at")
    figures = PoolFigures()
    for pod in pods.order_by():
        figures.states[pod.pool_id][pod.state] += 1
        if pod.state == Pod.State.READY:
            figures.ready_lanes[pod.pool_id] += pod.lanes
        if pod.is_alive and pod.billed_from:
            figures.dollars_per_hour[pod.pool_id] += pod.cost_per_hr
        figures.dollars[pod.pool_id] += pod.spend(at=now)
    for pool_id, tally in tallies.items():
        for state in PoolPodTally.ENDED_STATES:
            figures.states[pool_id][state] += tally[state] or 0
        figures.dollars[pool_id] += tally["dollars"] or Decimal(0)
    return figures


def pool_metrics(pools: dict[int, str], figures: PoolFigures, pages: dict[int, dict[str, int]]) -> Iterator[Metric]:
    """Pods by state, lanes, pages and dollars of each pool (``pools``: {id: key})."""
    by_state = GaugeMetricFamily("fleetadmin_pods", "Pods by state", labels=["pool", "state"])
    lanes_used = GaugeMetricFamily("fleetadmin_lanes_used", "Pages out at a pod", labels=["pool"])
    lanes_total = GaugeMetricFamily("fleetadmin_lanes_total", "Lanes of ready pods", labels=["pool"])
    backlog = GaugeMetricFamily("fleetadmin_backlog_pages", "Pages waiting for a lane", labels=["pool"])
    done = CounterMetricFamily("fleetadmin_pages_done", "Pages with their text", labels=["pool"])
    failed = CounterMetricFamily("fleetadmin_pages_failed", "Pages that spent their attempts", labels=["pool"])
    per_hour = GaugeMetricFamily("fleetadmin_dollars_per_hour", "What the live pods cost now", labels=["pool"])
    spend = CounterMetricFamily("fleetadmin_spend_dollars", "Dollars billed by every pod so far", labels=["pool"])
    for pool_id, key in pools.items():
        for state in Pod.State.values:
            by_state.add_metric([key, state], figures.states[pool_id][state])
        counts = pages.get(pool_id, NO_PAGES)
        lanes_used.add_metric([key], counts["running"])
        lanes_total.add_metric([key], figures.ready_lanes[pool_id])
        backlog.add_metric([key], counts["waiting"])
        done.add_metric([key], counts["done"])
        failed.add_metric([key], counts["failed"])
        per_hour.add_metric([key], float(figures.dollars_per_hour[pool_id]))
        spend.add_metric([key], float(figures.dollars[pool_id]))
    yield from (by_state, lanes_used, lanes_total, backlog, done, failed, per_hour, spend)


def boot_metrics(pools: dict[int, str], *, now: datetime) -> Iterator[Metric]:
    """Create calls by outcome, the capacity verdicts in force, the open alerts by kind."""
    attempts = CounterMetricFamily("fleetadmin_boot_attempts", "Create calls at a provider, by outcome",
                                   labels=["pool", "outcome"])  # fmt: skip
    for pool_id, outcome, n in BootAttemptTally.objects.values_list("pool_id", "outcome", "n"):
        attempts.add_metric([pools.get(pool_id, str(pool_id)), outcome], n)
    yield attempts
    verdicts = CapacityVerdict.objects.aggregate(
        blocked=Count("id", filter=Q(blocked_until__gt=now)),
        probing=Count("id", filter=Q(probing_until__gt=now)),
    )
    blocked_help = "Candidates skipped by every booter after 'no capacity'"
    yield GaugeMetricFamily("fleetadmin_capacity_verdicts_blocked", blocked_help, value=verdicts["blocked"])
    probing_help = "Candidates one boot is trying now"
    yield GaugeMetricFamily("fleetadmin_capacity_verdicts_probing", probing_help, value=verdicts["probing"])
    alerts = dict(Alert.objects.filter(resolved_at__isnull=True).values_list("kind").annotate(n=Count("id")).order_by())
    open_alerts = GaugeMetricFamily("fleetadmin_alerts_open", "Unresolved alerts", labels=["kind"])
    for kind in Alert.Kind.values:
        open_alerts.add_metric([kind], alerts.get(kind, 0))
    yield open_alerts
