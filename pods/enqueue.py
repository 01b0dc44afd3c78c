"""Sending pods' tasks (pods/tasks.py) to their clusters, under a task name and group that say
what each is (the admin and the loop gauges show them). By dotted name: this module imports no
service and no task body, so a service imports it at module level.
"""

from __future__ import annotations

from datetime import timedelta

from django.db.models import Q
from django.utils import timezone
from django_q.tasks import async_task

from fleetadmin.clusters import PASSES, SHORT, cluster_name
from pods.models import Pool

# A nudged tick still waiting in the queue after this long may have been lost: nudges queue again.
NUDGE_COALESCE_SECONDS = 5.0


def _send(task: str, *args, name: str, group: str, work_class: str = SHORT, save: bool = True) -> None:
    """Queue ``pods.tasks.<task>`` for its work class's cluster (fleetadmin/clusters.py); ``save`` False: its
    success is not kept (a failure is)."""
    async_task(f"pods.tasks.{task}", *args, task_name=name, group=group,
               cluster=cluster_name(work_class), save=save)  # fmt: skip


def enqueue_pass() -> None:
    """To the passes cluster: a pass never waits behind splits."""
    _send("advance_pods", name="pass", group="passes", work_class=PASSES)


def nudge_scaler(pool_id: int) -> None:
    """Run a tick soon rather than waiting for the schedule (which may fire ~30 s late). Nudges
    come with every burst of work; their successes are not kept (the minute's tick's are).

    Nudges coalesce: one that comes while a nudged tick of the pool waits in the queue (queued,
    not started) queues none, as that tick starts after it and reads what it is about (call it
    once the change it is about is committed). The ingest benchmark's first half-second had
    7-10 nudges, one per document split before the dispatcher was live, each a full tick of
    20-80 ms of CPU. A tick queued more than NUDGE_COALESCE_SECONDS ago no longer counts (a
    worker killed with -9 may have lost it): the nudge queues another."""
    now = timezone.now()
    stale = now - timedelta(seconds=NUDGE_COALESCE_SECONDS)
    if not Pool.objects.filter(Q(nudged_at=None) | Q(nudged_at__lt=stale), pk=pool_id).update(nudged_at=now):
        return  # a nudged tick is queued and has not started yet (or the pool is gone)
    _send("scaler_tick", pool_id, name=f"tick pool {pool_id}", group="scaler", save=False)


def enqueue_fetch_catalogue(provider_name: str) -> None:
    """Fetch the provider's prices now (not from the cache)."""
    _send("fetch_catalogue", provider_name, True, name=f"prices {provider_name}", group="prices")


def enqueue_scale(request_id: int, *, pool_key: str) -> None:
    _send("scale_pool", request_id, name=f"scale {pool_key}", group="scaler")
