"""``GET /metrics``: the fleet in the Prometheus text format.

Everything is read from the database on each scrape (a registry per request),
so any front answers for every process: the loops of the front and of every
dispatcher (their ``LoopHeartbeat`` rows), pods, lanes, backlog, pages, boots,
capacity verdicts and spend. A fixed handful of queries whatever the fleet.

It needs the ``read`` scope like the rest of the API. For Prometheus, issue a
token that can only read and use it as the scrape's bearer token::

    python manage.py apitoken USER --scopes read --name prometheus

    # prometheus.yml
    - job_name: fleetadmin
      authorization: {credentials: fa_...}
      static_configs: [{targets: ["127.0.0.1:8000"]}]

No label carries free text written by people or providers (errors, messages),
and nothing here reads settings or the environment: no secret can leak.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterator
from decimal import Decimal

from django.db.models import Count, Q
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from fleetadmin.api import api_view
from fleetadmin.models import LoopHeartbeat

LOOP_LABELS = ["name", "kind", "host", "pid"]


class FleetCollector(Collector):
    """Fills a scrape from the database."""

    def collect(self) -> Iterator[Metric]:
        yield from self.loops()
        yield from self.fleet()

    def loops(self) -> Iterator[Metric]:
        now = timezone.now()
        lag = GaugeMetricFamily("fleetadmin_loop_lag_seconds", "How late the loop's sampler woke last time",
                                labels=LOOP_LABELS)  # fmt: skip
        worst = GaugeMetricFamily("fleetadmin_loop_worst_lag_seconds", "The latest the loop's sampler woke",
                                  labels=LOOP_LABELS)  # fmt: skip
        stalls = CounterMetricFamily("fleetadmin_loop_stalls", "Sampler wake-ups later than the stall threshold",
                                     labels=LOOP_LABELS)  # fmt: skip
        blocked = CounterMetricFamily("fleetadmin_loop_blocked_seconds", "Sum of the lag of every stall",
                                      labels=LOOP_LABELS)  # fmt: skip
        stale = GaugeMetricFamily("fleetadmin_loop_stale", "1 when the loop has not reported for 10 s (stuck or gone)",
                                  labels=LOOP_LABELS)  # fmt: skip
        age = GaugeMetricFamily("fleetadmin_loop_report_age_seconds", "Seconds since the loop last reported",
                                labels=LOOP_LABELS)  # fmt: skip
        for beat in LoopHeartbeat.objects.for_dashboard(now=now):
            labels = [beat.name, beat.kind, beat.host, str(beat.pid)]
            lag.add_metric(labels, beat.lag_s)
            worst.add_metric(labels, beat.worst_lag_s)
            stalls.add_metric(labels, beat.stalls)
            blocked.add_metric(labels, beat.blocked_s)
            stale.add_metric(labels, 1.0 if beat.stale else 0.0)
            age.add_metric(labels, max(0.0, (now - beat.updated_at).total_seconds()))
        yield from (lag, worst, stalls, blocked, stale, age)

    def fleet(self) -> Iterator[Metric]:
        # function-level: the platform reads the apps only when scraped; fleetadmin imports no app at module level
        from ocrjobs.selectors import pools_page_totals
        from pods.models import Alert, BootAttemptTally, CapacityVerdict, Pod, Pool, PoolPodTally

        now = timezone.now()
        # Each pool with its ended pods' tally (a left join: one query).
        rows = Pool.objects.values_list(
            "pk", "key", *(f"pod_tally__{f}" for f in (*PoolPodTally.ENDED_STATES, "dollars"))
        )
        pools = {row[0]: row[1] for row in rows}
        tallies = {row[0]: dict(zip((*PoolPodTally.ENDED_STATES, "dollars"), row[2:], strict=True)) for row in rows}
        # The live pods, and a tally of the ended ones kept as each ended: not every pod ever rented.
        pods = list(
            Pod.objects.alive().only("pool_id", "state", "lanes", "cost_per_hr", "billed_from", "ended_at").order_by()
        )

        pages = pools_page_totals(now=now)
        boots = BootAttemptTally.objects.values_list("pool_id", "outcome", "n")
        verdicts = CapacityVerdict.objects.aggregate(
            blocked=Count("id", filter=Q(blocked_until__gt=now)),
            probing=Count("id", filter=Q(probing_until__gt=now)),
        )
        alerts = dict(
            Alert.objects.filter(resolved_at__isnull=True).values_list("kind").annotate(n=Count("id")).order_by()
        )

        by_state = GaugeMetricFamily("fleetadmin_pods", "Pods by state", labels=["pool", "state"])
        lanes_used = GaugeMetricFamily("fleetadmin_lanes_used", "Pages being forwarded", labels=["pool"])
        lanes_total = GaugeMetricFamily("fleetadmin_lanes_total", "Lanes of ready pods", labels=["pool"])
        backlog = GaugeMetricFamily("fleetadmin_backlog_pages", "Pages waiting for a lane", labels=["pool"])
        done = CounterMetricFamily("fleetadmin_pages_done", "Pages with their text", labels=["pool"])
        failed = CounterMetricFamily("fleetadmin_pages_failed", "Pages that spent their attempts", labels=["pool"])
        per_hour = GaugeMetricFamily("fleetadmin_dollars_per_hour", "What the live pods cost now", labels=["pool"])
        spend = CounterMetricFamily("fleetadmin_spend_dollars", "Dollars billed by every pod so far", labels=["pool"])

        states: dict[int, Counter] = defaultdict(Counter)
        ready_lanes: Counter = Counter()
        dollars_per_hour: dict[int, Decimal] = defaultdict(Decimal)
        dollars: dict[int, Decimal] = defaultdict(Decimal)
        for pod in pods:
            states[pod.pool_id][pod.state] += 1
            if pod.state == Pod.State.READY:
                ready_lanes[pod.pool_id] += pod.lanes
            if pod.is_alive and pod.billed_from:
                dollars_per_hour[pod.pool_id] += pod.cost_per_hr
            dollars[pod.pool_id] += pod.spend(at=now)
        for pool_id, tally in tallies.items():
            for state in PoolPodTally.ENDED_STATES:
                states[pool_id][state] += tally[state] or 0
            dollars[pool_id] += tally["dollars"] or Decimal(0)
        for pool_id, key in pools.items():
            for state in Pod.State.values:
                by_state.add_metric([key, state], states[pool_id][state])
            counts = pages.get(pool_id, {"done": 0, "failed": 0, "waiting": 0, "running": 0})
            lanes_used.add_metric([key], counts["running"])
            lanes_total.add_metric([key], ready_lanes[pool_id])
            backlog.add_metric([key], counts["waiting"])
            done.add_metric([key], counts["done"])
            failed.add_metric([key], counts["failed"])
            per_hour.add_metric([key], float(dollars_per_hour[pool_id]))
            spend.add_metric([key], float(dollars[pool_id]))
        yield from (by_state, lanes_used, lanes_total, backlog, done, failed, per_hour, spend)

        attempts = CounterMetricFamily("fleetadmin_boot_attempts", "Create calls at a provider, by outcome",
                                       labels=["pool", "outcome"])  # fmt: skip
        for pool_id, outcome, n in boots:
            attempts.add_metric([pools.get(pool_id, str(pool_id)), outcome], n)
        yield attempts
        blocked_help = "Candidates skipped by every booter after 'no capacity'"
        yield GaugeMetricFamily("fleetadmin_capacity_verdicts_blocked", blocked_help, value=verdicts["blocked"])
        probing_help = "Candidates one boot is trying now"
        yield GaugeMetricFamily("fleetadmin_capacity_verdicts_probing", probing_help, value=verdicts["probing"])
        open_alerts = GaugeMetricFamily("fleetadmin_alerts_open", "Unresolved alerts", labels=["kind"])
        for kind in Alert.Kind.values:
            open_alerts.add_metric([kind], alerts.get(kind, 0))
        yield open_alerts


@api_view(scope="read")
def metrics(request: HttpRequest) -> HttpResponse:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(FleetCollector())
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)
