"""Dispatchers: a pool's slots (at most DISPATCHERS_PER_POOL alive) and starting one."""

from __future__ import annotations

import os
import uuid

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from ocrjobs.enqueue import enqueue_dispatch
from ocrjobs.models import Dispatcher
from ocrjobs.selectors import pages_waiting
from pods.models import Pod, Pool


def dispatch_ensure(*, pool: Pool) -> bool:
    """Start a dispatcher for the pool unless enough are alive. True if one was enqueued."""
    if Dispatcher.objects.live().filter(pool=pool).count() >= settings.DISPATCHERS_PER_POOL:
        return False
    transaction.on_commit(lambda: enqueue_dispatch(pool))
    return True


def dispatch_for_pod_ready(*, pod: Pod) -> bool:
    """A pod joined (``pods.hooks`` ``pod_ready``): its pool's pages waiting get a dispatcher.
    True if one was enqueued."""
    return bool(pages_waiting(pool_id=pod.pool_id)) and dispatch_ensure(pool=pod.pool)


def dispatcher_register(*, pool_id: int) -> Dispatcher | None:
    """Take a dispatcher slot for the pool, or None when enough are alive."""
    with transaction.atomic():
        Pool.objects.select_for_update().filter(pk=pool_id).first()  # serialises registration on PostgreSQL
        if Dispatcher.objects.live().filter(pool_id=pool_id).count() >= settings.DISPATCHERS_PER_POOL:
            return None
        return Dispatcher.objects.create(
            pool_id=pool_id, token=uuid.uuid4().hex, host=settings.HOST_ID, pid=os.getpid()
        )


def dispatcher_end(*, dispatcher: Dispatcher) -> None:
    Dispatcher.objects.filter(pk=dispatcher.pk).update(ended_at=timezone.now())
