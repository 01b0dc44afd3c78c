"""Passes: rows in a state, advanced one short step at a time (invariant 15).

No task waits in a worker on another machine or on the clock. A boot, a release, a scale
request, a due shed tick and a webhook delivery are rows; a pass finds the rows that are due and moves each one
step (one provider call or one pod health check, bounded in time) on a bounded thread pool,
then ends. This is how Karpenter's and dstack's controllers work.

A pass is asked for (``pass_request``) whenever something may be due: by the workers'
supervisor every ``PASS_INTERVAL_SECONDS`` while anything is due and by the scaler tick
(``pass_tick``), and as soon as a row becomes due (a boot created, a release asked). One pass
at a time, deployment-wide: the ``PassLease`` row is queued or held by at most one pass task,
and a pass task the broker lost is sent again after ``PASS_START_GRACE_SECONDS``. Passes run in
a django-q2 cluster of their own (fleetadmin/clusters.py): they never queue behind splits.
"""

from __future__ import annotations

import functools
import logging
import operator
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connections, transaction
from django.db.models import Exists, Q, QuerySet
from django.utils import timezone

from fleetadmin import leases
from pods.enqueue import enqueue_pass
from pods.models import PassLease, Pool

log = logging.getLogger(__name__)

KIND = "pods"


@dataclass(frozen=True)
class Work:
    """One kind of row a pass advances: which are due now (at most ``limit``), and one step of one.

    ``waiting(now)``, if given, is a queryset of the rows that may be due (``rows_waiting`` asks
    them all in one query); a kind whose rows another kind's ``waiting`` covers leaves it out."""

    name: str
    due: Callable[..., list[int]]  # due(*, now: datetime, limit: int) -> ids
    step: Callable[[int], object]  # step(id): one short step; handles its own failures
    waiting: Callable[[datetime], QuerySet] | None = None


# Filled by each app's AppConfig.ready() (pods/apps.py, ocrjobs/apps.py), in INSTALLED_APPS order.
_KINDS: dict[str, Work] = {}


def register(work: Work) -> None:
    """Add a kind of work to every pass (again under the same name: replaced)."""
    _KINDS[work.name] = work


def kinds_of_work() -> list[Work]:
    return list(_KINDS.values())


@dataclass
class PassResult:
    steps: dict[str, int] = field(default_factory=dict)  # kind of work -> steps taken
    errors: int = 0
    seconds: float = 0.0


def pass_due(*, now: datetime | None = None) -> bool:
    """Whether any row is due a step now."""
    now = now or timezone.now()
    return any(work.due(now=now, limit=1) for work in kinds_of_work())


def rows_waiting(*, now: datetime) -> bool:
    """Whether any row may be due a step, in one query: each kind's ``waiting`` rows (a pod whose
    step time has come, a pool whose shed tick has, a scale request still pending, a webhook
    delivery whose next attempt has). Every kind's ``due`` picks among these rows only, so when
    this is False, nothing is due."""
    waiting = [Exists(work.waiting(now)) for work in kinds_of_work() if work.waiting is not None]
    # all belong to a pool (a delivery to a job of one)
    return bool(waiting) and Pool.objects.filter(functools.reduce(operator.or_, waiting)).exists()


def pass_tick(*, now: datetime | None = None) -> bool:
    """Ask for a pass if anything is due: what the workers' clock does every
    ``PASS_INTERVAL_SECONDS`` and the scaler tick does too (for a deployment that runs plain
    qclusters). One query when nothing waits. True if a pass was sent."""
    now = now or timezone.now()
    return rows_waiting(now=now) and pass_due(now=now) and pass_request()


def pass_request() -> bool:
    """Have a pass run soon, unless one is queued or running already. True if one was sent."""
    now = timezone.now()
    row, _ = PassLease.objects.get_or_create(name=KIND)
    free = Q(task_lease_until__isnull=True) | Q(task_lease_until__lt=now)
    queued = {
        "task_lease_until": now + timedelta(seconds=settings.PASS_START_GRACE_SECONDS),
        "task_lease_token": "",
    }
    if not PassLease.objects.filter(pk=row.pk).filter(free).update(**queued):
        return False
    transaction.on_commit(enqueue_pass)
    return True


def _step(work: Work, row_id: int) -> bool:
    """One step on a thread of the pass; whether it raised. Each thread's connection is closed
    after its step: the pool's threads are not Django's request threads."""
    try:
        work.step(row_id)
        return False
    except Exception:
        log.exception("%s step of %s failed; it is tried again on a later pass", work.name, row_id)
        return True
    finally:
        connections.close_all()


def _renew_until_done(rows, lease: str, submitted: list) -> None:
    """Wait for the steps, renewing the pass's short lease while they run: a pass killed with -9
    holds it no longer than PASS_LEASE_SECONDS, however long its steps may take."""
    pending = set(submitted)
    while pending:
        _, pending = wait(pending, timeout=settings.PASS_LEASE_SECONDS / 3)
        if pending:
            try:
                leases.renew(rows, lease, seconds=settings.PASS_LEASE_SECONDS)
            except leases.LeaseLost:
                log.warning("another pass took the lease while this one's steps ran")


def pass_run(*, limit: int | None = None) -> PassResult | None:
    """Take the pass's lease and advance every due row one step (``limit`` rows of each kind at
    most), ``PASS_CONCURRENCY`` steps at a time; None when another pass holds the lease."""
    rows = PassLease.objects.filter(name=KIND)
    PassLease.objects.get_or_create(name=KIND)
    lease = leases.acquire(rows, seconds=settings.PASS_LEASE_SECONDS)
    if lease is None:
        return None
    started = time.monotonic()
    result = PassResult()
    try:
        now = timezone.now()
        with ThreadPoolExecutor(settings.PASS_CONCURRENCY, thread_name_prefix="pass") as executor:
            submitted = []
            for work in kinds_of_work():
                ids = work.due(now=now, limit=limit or settings.PASS_BATCH)
                result.steps[work.name] = len(ids)
                submitted += [executor.submit(_step, work, row_id) for row_id in ids]
            _renew_until_done(rows, lease, submitted)
            result.errors = sum(future.result() for future in submitted)
    finally:
        leases.release(rows, lease)
    result.seconds = round(time.monotonic() - started, 3)
    if any(result.steps.values()):
        log.info("pass: %s steps in %.2f s, %d failed", result.steps, result.seconds, result.errors)
    if pass_due():
        pass_request()  # rows became due while this one ran (not ones due later: the clock asks for those)
    return result
