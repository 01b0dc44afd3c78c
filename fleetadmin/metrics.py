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

from collections.abc import Callable, Iterable, Iterator

from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from fleetadmin.api import api_view
from fleetadmin.models import LoopHeartbeat

LOOP_LABELS = ["name", "kind", "host", "pid"]


# What each app adds to a scrape, registered from its AppConfig.ready() (pods/registrations.py:
# pods.metrics.fleet_metrics): the platform imports no app.
_SOURCES: dict[str, Callable[[], Iterable[Metric]]] = {}


def register_source(name: str, source: Callable[[], Iterable[Metric]]) -> None:
    """Add an app's metrics to every scrape (again under the same name: replaced)."""
    _SOURCES[name] = source


class FleetCollector(Collector):
    """Fills a scrape from the database: the loops, then each registered app's metrics."""

    def collect(self) -> Iterator[Metric]:
        if not _SOURCES:
            raise RuntimeError("fleetadmin.metrics: no app registered its metrics (is pods in INSTALLED_APPS?)")
        yield from self.loops()
        for source in _SOURCES.values():
            yield from source()

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


@api_view(scope="read")
def metrics(request: HttpRequest) -> HttpResponse:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(FleetCollector())
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)
