"""django-q2 tasks: each takes ids and calls a service."""

from __future__ import annotations

import logging
import time
from datetime import datetime

from django.utils import timezone

from fleetadmin.db import retry_on_db_error
from pods.models import Pod, Pool
from pods.providers.base import ProviderError
from pods.services import boot, lifecycle, reconcile, scale_requests, scaler

log = logging.getLogger(__name__)


@retry_on_db_error
def boot_pod(pod_id: int) -> str:
    pod = boot.pod_boot(pod_id=pod_id)
    return f"{pod.name}: {pod.state}"


@retry_on_db_error
def scaler_tick(pool_id: int | None = None) -> list[dict]:
    """Reconcile each provider in use with the database, then tick every pool (or one)."""
    pools = list(Pool.objects.all() if pool_id is None else Pool.objects.filter(pk=pool_id))
    for provider_name in sorted({pool.provider for pool in pools}):
        try:
            reconcile.reconcile(provider_name=provider_name)
        except ProviderError as exc:
            log.warning("reconcile %s failed: %s; ticking on what the database knows", provider_name, exc)
    from ocrjobs.services import documents_recover

    for pool in pools:
        # Tasks the broker lost (a worker killed with -9 on Redis, a cluster restarted).
        boot.boots_recover(pool=pool)
        documents_recover(pool_id=pool.pk)
    return [vars(scaler.pool_tick(pool=pool)) for pool in pools]


@retry_on_db_error
def shed_tick(pool_id: int, at: str) -> str:
    """A tick at a set time (``at``, ISO 8601): when a surplus pod will have idled long enough."""
    when = datetime.fromisoformat(at)
    delay = (when - timezone.now()).total_seconds()
    if delay > 0:
        time.sleep(min(delay, scaler.SHED_TICK_HORIZON_SECONDS))
    if not Pool.objects.filter(pk=pool_id, shed_tick_at=when).update(shed_tick_at=None):
        return "superseded by an earlier tick"
    scaler_tick(pool_id)
    return "ticked"


def nudge_scaler(pool_id: int) -> None:
    """Run a tick soon rather than waiting for the schedule (which may fire ~30 s late)."""
    from django_q.tasks import async_task

    async_task("pods.tasks.scaler_tick", pool_id, task_name=f"tick pool {pool_id}", group="scaler")


@retry_on_db_error
def fetch_catalogue(provider_name: str, fresh: bool = False) -> int:
    from pods import capacity

    return len(capacity.catalogue_get(provider_name, fresh=fresh).offers)


@retry_on_db_error
def scale_pool(request_id: int) -> dict:
    return scale_requests.scale_request_run(request_id=request_id).to_dict()


@retry_on_db_error
def terminate_at_provider(pod_id: int) -> str:
    """The provider side of a release asked from the front (spend is already attributed)."""
    pod = Pod.objects.select_related("pool").get(pk=pod_id)
    lifecycle.terminate_quietly(pod)
    return f"{pod.name}: terminated"
