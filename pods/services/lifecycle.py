"""A pod's life after it joins: marked busy while it has pages, drained when it fails, ended in the
database (its pages wait again, its spend is attributed) and terminated at the provider."""

from __future__ import annotations

import logging
from datetime import datetime

from django.db import transaction

from pods.models import Pod
from pods.providers import get_provider
from pods.providers.base import Provider, ProviderError
from pods.spend import spend_attribute

log = logging.getLogger(__name__)


def pod_end(*, pod: Pod, state: str, error: str = "") -> Pod:
    """Record that a pod ended: its pages in flight wait again and its spend is attributed."""
    with transaction.atomic():
        pod.mark_ended(state, error=error)
        _requeue_pages_of(pod)
        spend_attribute(pod)
    return pod


def pod_release(*, pod: Pod, reason: str) -> Pod:
    """Attribute spend, terminate at the provider, free its pages. Idempotent."""
    if not pod.is_alive:
        return pod
    # Ended first: a boot still waiting on this pod sees it and does not join.
    pod_end(pod=pod, state=Pod.State.TERMINATED, error=f"released: {reason}")
    provider = get_provider(pod.pool.provider)
    _terminate_quietly(provider, pod)
    log.info("pod %s released (%s), spend $%s", pod.name, reason, pod.spend())
    return pod


def pod_release_request(*, pod: Pod, reason: str) -> bool:
    """A release asked from the front: ended and its spend attributed now, in the database;
    terminated at the provider by a worker. False if it had already ended (idempotent)."""
    from pods.tasks import enqueue_terminate

    if not pod.is_alive:
        return False
    with transaction.atomic():
        current = Pod.objects.select_for_update().select_related("pool").get(pk=pod.pk)
        if not current.is_alive:
            return False
        pod_end(pod=current, state=Pod.State.TERMINATED, error=f"released: {reason}")
        transaction.on_commit(lambda: enqueue_terminate(pod.pk, pod_name=pod.name))
    return True


def pod_drain(*, pod_id: int, error: str) -> bool:
    """A ready pod that fails gets no more pages; the scaler releases it once none of its pages
    runs, and hears of it now. False if the pod was not ready (drained already, or ended)."""
    from pods.tasks import nudge_scaler

    updated = Pod.objects.filter(pk=pod_id, state=Pod.State.READY).update(
        state=Pod.State.DRAINING, error=f"drained after {error}"[:2000]
    )
    if updated:
        log.warning("pod %s drained after %s", pod_id, error)
        nudge_scaler(Pod.objects.get(pk=pod_id).pool_id)
    return bool(updated)


def pods_mark_busy(*, pod_ids: list[int], at: datetime) -> None:
    """The pods had pages out at ``at``: a shed counts their idle time from then."""
    if pod_ids:
        Pod.objects.filter(pk__in=pod_ids).update(last_busy_at=at)


def terminate_quietly(pod: Pod) -> None:
    _terminate_quietly(get_provider(pod.pool.provider), pod)


def _terminate_quietly(provider: Provider, pod: Pod) -> None:
    if not pod.provider_id:
        return
    try:
        provider.terminate(pod.provider_id)
    except ProviderError as exc:
        log.error("terminating %s failed: %s (reconcile will try again)", pod.name, exc)


def _requeue_pages_of(pod: Pod) -> int:
    from ocrjobs.services.pages import pages_requeue_from_pod

    return pages_requeue_from_pod(pod_id=pod.pk)
