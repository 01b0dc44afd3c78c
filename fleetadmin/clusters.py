"""The work classes: a django-q2 cluster each, with capacity of its own, and the clock for passes.

A worker that waits holds its capacity from everything queued behind it, so work that runs long
gets capacity that short tasks never share (invariant 15):

- ``short``: splits, fetches, scaler ticks, catalogue fetches, scale-request starts. Seconds of
  CPU or one HTTP call each. ``Q_WORKERS`` workers, the cluster named ``Q_CLUSTER_NAME``; the
  schedules are pinned to it.
- ``passes``: ``pods.tasks.advance_pods``. One pass runs at a time deployment-wide (its lease) with
  ``PASS_CONCURRENCY`` threads inside it, so ``Q_PASS_WORKERS`` (1) is enough; a pass never queues
  behind splits, so a release reaches the provider within seconds however busy the short workers are.
- ``dispatch``: ``ocrjobs.tasks.dispatch_pool``, a loop that runs for minutes with hundreds of page
  forwards in flight. ``DISPATCHERS_PER_POOL`` × pools workers (counted when ``manage.py workers``
  starts, at least ``DISPATCHERS_PER_POOL``): every loop that may run at once has its worker.
- ``outputs``: searchable PDFs (ocrjobs/output_tasks.py), work a user may not need and pages never
  wait for (invariant 20): ``Q_OUTPUT_WORKERS`` (1) builds at once, in processes ``OUTPUTS_NICE``
  below the other workers' CPU priority, so that on a machine they share a build takes only the CPU
  that splits, dispatch and the pods leave (bench/ingest.py --pdf). On the short workers, building
  every finished job's PDFs cut bench/ingest.py from 625 to 199-307 pages/s (issue 37).

django-q2 keys each cluster's queue by its name (an ``OrmQ.key`` on the ORM broker, a list
``django_q:<name>:q`` on Redis): ``Q_CLUSTER_NAME`` for short tasks, ``<that>:passes`` and
``<that>:dispatch`` and ``<that>:outputs`` for the others. A cluster process picks its class's ``ALT_CLUSTERS`` settings
by the ``Q_CLUSTER_NAME`` in its environment, which ``manage.py workers`` sets for each.

The clock: passes are asked for when a row becomes due now (a boot created, a release asked), and
by ``manage.py workers`` every ``PASS_INTERVAL_SECONDS`` while anything is due (boot steps that wait
on the clock, terminate back-offs, shed ticks, pending scale requests).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

from django.conf import settings

log = logging.getLogger(__name__)

SHORT, PASSES, DISPATCH, OUTPUTS = "short", "passes", "dispatch", "outputs"
CLASSES = (SHORT, PASSES, DISPATCH, OUTPUTS)
DESCRIPTIONS = {SHORT: "short tasks", PASSES: "passes", DISPATCH: "dispatch loops", OUTPUTS: "outputs"}


def cluster_name(work_class: str) -> str:
    """The django-q2 cluster (and queue) of a work class in this deployment."""
    from django_q.conf import Conf  # the name in use (tests give a cluster a name of its own)

    if work_class not in CLASSES:
        raise ValueError(f"no work class {work_class!r}")
    return Conf.PREFIX if work_class == SHORT else f"{Conf.PREFIX}:{work_class}"


def brokers() -> dict[str, object]:
    """Each work class's broker (its queue)."""
    from django_q.brokers import get_broker

    return {work_class: get_broker(cluster_name(work_class)) for work_class in CLASSES}


@dataclass(frozen=True)
class WorkClass:
    name: str
    workers: int
    timeout: int  # seconds a task may run before django-q2 stops its worker
    sized_by: str  # what the size comes from, for the log

    def describe(self) -> str:
        workers = f"{self.workers} worker{'s' if self.workers != 1 else ''}"
        return f"{DESCRIPTIONS[self.name]}: {workers} ({self.sized_by}; time limit {self.timeout} s)"


def pools_counted() -> int | None:
    """How many pools there are, or None when the database cannot say (not migrated, unreachable)."""
    from django.apps import apps
    from django.db import DatabaseError

    try:
        return apps.get_model("pods", "Pool").objects.count()  # the platform imports no app
    except DatabaseError as exc:
        log.warning("could not count the pools (%s); the dispatch cluster gets its minimum size", exc)
        return None


def work_classes() -> list[WorkClass]:
    """The classes and their sizes, as ``manage.py workers`` starts them (reads the pools)."""
    per_pool = settings.DISPATCHERS_PER_POOL
    pools = pools_counted()
    dispatchers = per_pool * max(1, pools or 0)
    return [
        WorkClass(SHORT, settings.Q_CLUSTER["workers"], settings.Q_TIMEOUT, "Q_WORKERS"),
        WorkClass(PASSES, settings.Q_PASS_WORKERS, settings.Q_PASS_TIMEOUT, "Q_PASS_WORKERS"),
        WorkClass(DISPATCH, dispatchers, settings.Q_DISPATCH_TIMEOUT,
                  f"DISPATCHERS_PER_POOL {per_pool} × {'?' if pools is None else pools} pools"),
        WorkClass(OUTPUTS, settings.Q_OUTPUT_WORKERS, settings.Q_OUTPUT_TIMEOUT, "Q_OUTPUT_WORKERS"),
    ]  # fmt: skip


def cluster_env(work_class: WorkClass, classes: list[WorkClass]) -> dict[str, str]:
    """The environment of a class's cluster process: its cluster name and the dispatch size."""
    dispatch = next(c for c in classes if c.name == DISPATCH)
    return dict(os.environ, Q_CLUSTER_NAME=cluster_name(work_class.name), Q_DISPATCH_WORKERS=str(dispatch.workers))


def task_results_prune(kept: int | None = None) -> int:
    """Delete the successful tasks' rows beyond the newest ``kept`` (Q_SUCCESSES_KEPT); failures stay.
    The minute's scaler tick calls it: django-q2's own pruning (its ``save_limit``) loads every
    row kept before it saves each task, 34 ms a task once 1,000 are kept. The rows deleted."""
    from django_q.models import Success

    kept = settings.Q_SUCCESSES_KEPT if kept is None else kept
    old = list(Success.objects.order_by("-stopped", "-pk").values_list("pk", flat=True)[kept : kept + 10_000])
    return Success.objects.filter(pk__in=old).delete()[0] if old else 0


# What the clock asks for on each call, registered from an AppConfig.ready() (pods/registrations.py:
# pods.services.passes.pass_tick): the platform imports no app.
CLOCK_WORK: dict[str, Callable[[], object]] = {}


def register_clock_work(name: str, work: Callable[[], object]) -> None:
    """Have ``PassClock`` call ``work`` on each call (again under the same name: replaced)."""
    CLOCK_WORK[name] = work


class PassClock:
    """What ``manage.py workers`` calls every ``PASS_INTERVAL_SECONDS``: this host reports that it
    is alive (every HOST_REPORT_SECONDS), and a pass is asked for while anything is due (one query
    when nothing is: ``pods.services.passes.pass_tick``, registered as clock work). It never
    raises but when no app registered its work (a broken deployment): an error is logged (once a
    minute while it lasts) and the database connection closed, so that the next call opens a
    fresh one."""

    LOG_EVERY_SECONDS = 60.0

    def __init__(self) -> None:
        self.failing_since: float | None = None
        self._logged_at = -self.LOG_EVERY_SECONDS
        self._reported_at = -1e9

    def __call__(self) -> None:
        from django.db import connections

        # function-level: it reads models, which load after this module (fleetadmin/apps.py imports it)
        from fleetadmin.hosts import host_report

        if not CLOCK_WORK:
            raise RuntimeError("fleetadmin.clusters: no app registered the clock's work (is pods in INSTALLED_APPS?)")
        try:
            if time.monotonic() - self._reported_at >= settings.HOST_REPORT_SECONDS:
                host_report()  # this host is alive: its local pods are its own (fleetadmin/hosts.py)
                self._reported_at = time.monotonic()
            for work in CLOCK_WORK.values():
                work()
        except Exception:
            connections.close_all()
            now = time.monotonic()
            self.failing_since = self.failing_since or now
            if now - self._logged_at >= self.LOG_EVERY_SECONDS:
                self._logged_at = now
                log.exception("the pass clock failed; it tries again every %g s", settings.PASS_INTERVAL_SECONDS)
            return
        if self.failing_since is not None:
            log.info("the pass clock works again after %.0f s", time.monotonic() - self.failing_since)
            self.failing_since = None
