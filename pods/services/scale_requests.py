"""Requests to set a pool's size: stored by the front, run by a worker."""

from __future__ import annotations

import time

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from pods.models import Pod, Pool, ScaleRequest
from pods.services.scaler import pool_tick


def scale_request_create(*, pool: Pool, pods: int | None = None, delta: int | None = None, by: str = ""):
    """Check a request to set the pool's size, store it and hand it to a worker."""
    from pods.tasks import enqueue_scale

    if (pods is None) == (delta is None):
        raise ValueError("give exactly one of 'pods' (a number of pods) or 'delta' (a change)")
    if pods is None:
        current = pool.pods.filter(state__in=[Pod.State.BOOTING, Pod.State.READY], cancel_requested_at=None).count()
        pods = current + delta
    if pods < 0:
        raise ValueError(f"a pool cannot have {pods} pods")
    if pods > pool.max_pods:
        raise ValueError(f"pool {pool.key} allows at most {pool.max_pods} pods; asked for {pods}")
    with transaction.atomic():
        request = ScaleRequest.objects.create(pool=pool, target=pods, requested_by=by[:150])
        transaction.on_commit(lambda: enqueue_scale(request.pk, pool_key=pool.key))
    return request


def scale_request_run(*, request_id: int, timeout: float | None = None):
    """Set the warm floor to the target, tick (booting or shedding at once), then wait until
    the pool's serving pods match the target or the boots fail."""
    request = ScaleRequest.objects.select_related("pool").get(pk=request_id)
    if request.state != ScaleRequest.State.PENDING:
        return request
    pool = request.pool
    Pool.objects.filter(pk=pool.pk).update(min_pods=request.target)
    tick = pool_tick(pool=pool, force_shed=True)
    deadline = time.monotonic() + (timeout or settings.POD_RUNNING_TIMEOUT_SECONDS + settings.POD_READY_TIMEOUT_SECONDS)
    while True:
        pods = pool.pods.filter(cancel_requested_at=None)
        ready = pods.filter(state=Pod.State.READY).count()
        booting = pods.filter(state=Pod.State.BOOTING).count()
        if (ready == request.target and not booting) or not booting or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    result = {
        "ready": ready,
        "booting": booting,
        "booted": len(tick.booted),
        "released": len(tick.shed),
        "boots_cancelled": tick.boots_cancelled,
        "blocked": tick.blocked,
    }
    state = ScaleRequest.State.DONE if ready == request.target else ScaleRequest.State.FAILED
    ScaleRequest.objects.filter(pk=request.pk).update(state=state, result=result, finished_at=timezone.now())
    request.refresh_from_db()
    return request
