"""django-q2 tasks: each takes ids and calls a service. They are sent by the helpers of
``pods.enqueue`` (by dotted name), which import no service, so services import them at the top."""

from __future__ import annotations

import logging

from fleetadmin.clusters import task_results_prune
from fleetadmin.db import retry_on_db_error
from pods import capacity, hooks
from pods.models import Pool
from pods.providers.base import ProviderError
from pods.serializers import scale_request_dict
from pods.services import passes, reconcile, scale_requests, scaler

log = logging.getLogger(__name__)


@retry_on_db_error
def advance_pods() -> str:
    """One pass: every due boot, release, shed tick and scale request moves one step."""
    result = passes.pass_run()
    return "another pass holds the lease" if result is None else f"{result.steps} in {result.seconds} s"


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
    for pool in pools:
        # Tasks the broker lost (a worker killed with -9 on Redis, a cluster restarted). Boots need
        # no such thing: a step whose worker died leaves a lease that lapses, and the pod is due again.
        hooks.jobs().pool_housekeeping(pool_id=pool.pk)
    ticks = [vars(scaler.pool_tick(pool=pool)) for pool in pools]
    if pool_id is None:  # the minute's schedule, not a nudge
        task_results_prune()
        hooks.jobs().minute_housekeeping()  # staging, kept uploads, lost PDF builds
    try:
        passes.pass_tick()  # the clock, where plain qclusters run instead of `manage.py workers`
    except Exception:
        log.exception("asking for a pass failed; the workers' clock asks again")
    return ticks


@retry_on_db_error
def fetch_catalogue(provider_name: str, fresh: bool = False) -> int:
    return len(capacity.catalogue_get(provider_name, fresh=fresh).offers)


@retry_on_db_error
def scale_pool(request_id: int) -> dict:
    """The start of a scale request: the warm floor and one tick; passes take it from there."""
    return scale_request_dict(scale_requests.scale_request_start(request_id=request_id))
