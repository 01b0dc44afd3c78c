"""django-q2 tasks: each takes ids and calls a service; each has its enqueue helper beside it.

The helpers send a task by the dotted path of its function, under a task name and group that
say what it is (the admin and the loop gauges show them). pods.services calls them through an
import inside the function (this module imports pods.services)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import timedelta

from django.db.models import Q
from django.utils import timezone
from django_q.tasks import async_task

from fleetadmin.clusters import PASSES, SHORT, cluster_name, task_results_prune
from fleetadmin.db import retry_on_db_error
from pods.models import Pool
from pods.providers.base import ProviderError
from pods.services import passes, reconcile, scale_requests, scaler

log = logging.getLogger(__name__)

# A nudged tick still waiting in the queue after this long may have been lost: nudges queue again.
NUDGE_COALESCE_SECONDS = 5.0


def _send(task: Callable, *args, name: str, group: str, work_class: str = SHORT, save: bool = True) -> None:
    """Queue a task for its work class's cluster (fleetadmin/clusters.py); ``save`` False: its
    success is not kept (a failure is)."""
    async_task(f"{task.__module__}.{task.__name__}", *args, task_name=name, group=group,
               cluster=cluster_name(work_class), save=save)  # fmt: skip


@retry_on_db_error
def advance_pods() -> str:
    """One pass: every due boot, release, shed tick and scale request moves one step."""
    result = passes.pass_run()
    return "another pass holds the lease" if result is None else f"{result.steps} in {result.seconds} s"


def enqueue_pass() -> None:
    """To the passes cluster: a pass never waits behind splits."""
    _send(advance_pods, name="pass", group="passes", work_class=PASSES)


@retry_on_db_error
def scaler_tick(pool_id: int | None = None) -> list[dict]:
    """Reconcile each provider in use with the database, then tick every pool (or one)."""
    pools = Pool.objects.all() if pool_id is None else Pool.objects.filter(pk=pool_id)
    # Before anything is read: a nudge from now on queues a tick of its own (nudge_scaler).
    pools.exclude(nudged_at=None).update(nudged_at=None)
    pools = list(pools)
    for provider_name in sorted({pool.provider for pool in pools}):
        try:
            reconcile.reconcile(provider_name=provider_name)
        except ProviderError as exc:
            log.warning("reconcile %s failed: %s; ticking on what the database knows", provider_name, exc)
    from ocrjobs.services.split import documents_recover

    for pool in pools:
        # Tasks the broker lost (a worker killed with -9 on Redis, a cluster restarted). Boots need
        # no such thing: a step whose worker died leaves a lease that lapses, and the pod is due again.
        documents_recover(pool_id=pool.pk)
    ticks = [vars(scaler.pool_tick(pool=pool)) for pool in pools]
    if pool_id is None:  # the minute's schedule, not a nudge
        task_results_prune()
        from ocrjobs.tasks import prune_staging

        prune_staging()
    try:
        passes.pass_tick()  # the clock, where plain qclusters run instead of `manage.py workers`
    except Exception:
        log.exception("asking for a pass failed; the workers' clock asks again")
    return ticks


def nudge_scaler(pool_id: int) -> None:
    """Run a tick soon rather than waiting for the schedule (which may fire ~30 s late). Nudges
    come with every burst of work; their successes are not kept (the minute's tick's are).

    Nudges coalesce: one that comes while a nudged tick of the pool waits in the queue (queued,
    not started) queues none, as that tick starts after it and reads what it is about (call it
    once the change it is about is committed). Uncoalesced, bench/ingest.py's first half-second
    has 7-10 nudges, one per document split before the dispatcher is live, each a full tick of
    20-80 ms of CPU. A tick queued more than NUDGE_COALESCE_SECONDS ago no longer counts (a
    worker killed with -9 may have lost it): the nudge queues another."""
    now = timezone.now()
    stale = now - timedelta(seconds=NUDGE_COALESCE_SECONDS)
    if not Pool.objects.filter(Q(nudged_at=None) | Q(nudged_at__lt=stale), pk=pool_id).update(nudged_at=now):
        return  # a nudged tick is queued and has not started yet (or the pool is gone)
    _send(scaler_tick, pool_id, name=f"tick pool {pool_id}", group="scaler", save=False)


@retry_on_db_error
def fetch_catalogue(provider_name: str, fresh: bool = False) -> int:
    from pods import capacity

    return len(capacity.catalogue_get(provider_name, fresh=fresh).offers)


def enqueue_fetch_catalogue(provider_name: str) -> None:
    """Fetch the provider's prices now (not from the cache)."""
    _send(fetch_catalogue, provider_name, True, name=f"prices {provider_name}", group="prices")


@retry_on_db_error
def scale_pool(request_id: int) -> dict:
    """The start of a scale request: the warm floor and one tick; passes take it from there."""
    return scale_requests.scale_request_start(request_id=request_id).to_dict()


def enqueue_scale(request_id: int, *, pool_key: str) -> None:
    _send(scale_pool, request_id, name=f"scale {pool_key}", group="scaler")
