"""A pod's life after it joins: marked busy while it has pages, drained when it fails, ended in the
database (its pages wait again, its spend is attributed) and terminated at the provider by a pass."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.db import transaction
from django.utils import timezone

from fleetadmin.deployment import pod_prefix
from pods import hooks
from pods.audit import Actor, audit_record
from pods.enqueue import nudge_scaler
from pods.models import AuditEntry, Pod, PoolPodTally
from pods.providers import get_provider
from pods.providers.base import Provider, ProviderError
from pods.services import passes
from pods.spend import spend_attribute

log = logging.getLogger(__name__)

# A terminate the provider refused is tried again after as long as the pod has been ended so far
# (2, 2, 4, 8 … s), within these bounds: soon at first, then once a minute until it is confirmed.
TERMINATE_RETRY_MIN_SECONDS = 2.0
TERMINATE_RETRY_MAX_SECONDS = 60.0


def pod_end(*, pod: Pod, state: str, error: str = "") -> Pod:
    """Record that a pod ended: its pages in flight wait again and its spend is attributed. A pod
    the provider may still run (it has a provider id and was not lost) is terminated there by the
    next pass (``terminate_step``), asked for now, tried again until the provider confirms it."""
    with transaction.atomic():
        # Ended once, by whichever end finds it alive under its row lock (a release, a lost pod and
        # a failed boot may race): a later end neither counts it again nor changes how it ended.
        current = Pod.objects.select_for_update().filter(pk=pod.pk).values_list("state", flat=True).first()
        if current not in Pod.ALIVE_STATES:
            pod.refresh_from_db()
            pod_terminate_later(pod=pod)  # (its create may have come back since it ended)
            return pod
        pod.mark_ended(state, error=error)
        PoolPodTally.add(pod=pod)
        pod_terminate_later(pod=pod)
        _requeue_pages_of(pod)
        spend_attribute(pod)
    return pod


def pod_terminate_later(*, pod: Pod) -> bool:
    """Have the next pass terminate an ended pod at the provider, if the provider may run it (it
    has a provider id, was not lost, and is not marked already): also a pod whose create call came
    back after it ended (released while a boot step was creating it)."""
    if not pod.provider_id or pod.state == Pod.State.LOST or pod.terminate_pending:
        return False
    pod.terminate_pending, pod.step_at = True, timezone.now()
    Pod.objects.filter(pk=pod.pk).update(terminate_pending=True, step_at=pod.step_at)
    transaction.on_commit(passes.pass_request)
    return True


def pod_release(*, pod: Pod, reason: str, actor: Actor | None = None) -> bool:
    """End the pod now, in the database (its pages wait again, its spend is attributed); a pass
    terminates it at the provider within seconds. False if it had already ended (idempotent).
    ``actor``: the person who asked, recorded in the audit record (pods/audit.py)."""
    if not pod.is_alive:
        return False
    with transaction.atomic():
        current = Pod.objects.select_for_update().select_related("pool").get(pk=pod.pk)
        if not current.is_alive:
            return False
        # Ended first: a boot still waiting on this pod sees it and does not join.
        pod_end(pod=current, state=Pod.State.TERMINATED, error=f"released: {reason}")
        audit_record(actor=actor, action=AuditEntry.Action.RELEASE, pod=current, detail=reason)
    log.info("pod %s released (%s), spend $%s", current.name, reason, current.spend())
    return True


def pod_terminate(*, pod: Pod, actor: Actor, reason: str = "") -> bool:
    """Terminate the pod at the provider: a live pod is released; an ended one the provider may
    still run (a failed boot, a terminate given up on) is terminated again by the next pass, as
    ``pod_end`` asks. False if there is nothing to terminate (no provider id, lost, or already
    asked). Only the database is touched here; the provider is called by the pass."""
    if pod.is_alive:
        return pod_release(pod=pod, reason=reason or "terminated", actor=actor)
    with transaction.atomic():
        current = Pod.objects.select_for_update().get(pk=pod.pk)
        if current.is_alive or not current.provider_id or current.state == Pod.State.LOST:
            return False
        if current.terminate_pending:
            return False
        pod_terminate_later(pod=current)
        audit_record(actor=actor, action=AuditEntry.Action.TERMINATE, pod=current, detail=reason)
    return True


def pod_release_now(*, pod: Pod, reason: str) -> None:
    """Release the pod and terminate it at the provider in this process, for when no pass will
    come: a test or a benchmark cleaning up. (``manage.py up``, its workers stopped, does the
    same for its local pods in two steps: ``pod_release`` for each, then ``terminate_step``.)"""
    pod_release(pod=pod, reason=reason)
    terminate_step(pod.pk)


def local_pods_release(*, reason: str) -> int:
    """Release this host's local pods and terminate them here, for when no pass will come (the
    workers are stopped: ``manage.py up`` stopping, a benchmark ending), and any process of this
    deployment's left at the provider; how many pods were released. Pods run in sessions of their
    own, so that stopping the workers leaves them up: without this they would run on until their
    autostop."""
    local = Pod.objects.filter(pool__provider="local").reachable_here()
    released = sum(pod_release(pod=pod, reason=reason) for pod in local.alive())
    for pod_id in local.filter(terminate_pending=True).values_list("pk", flat=True):
        terminate_step(pod_id)
    provider = get_provider("local")
    for leftover in provider.list(prefix=f"{pod_prefix()}-"):
        provider.terminate(leftover.provider_id)
    return released


def terminations_due(*, now: datetime, limit: int) -> list[int]:
    """Ended pods whose provider terminate is not confirmed yet and is due a try, oldest first."""
    due = Pod.objects.filter(state__in=Pod.ENDED_STATES, terminate_pending=True, step_at__lte=now).reachable_here()
    return list(due.order_by("step_at").values_list("pk", flat=True)[:limit])


def terminate_step(pod_id: int) -> None:
    """One provider terminate of an ended pod. Confirmed (the provider terminated it, or no longer
    has it): nothing more to do. Refused: tried again after a back-off. The try is claimed first by
    moving ``step_at`` to the retry time, so two passes never both call, and a step killed
    mid-call is tried again at the back-off's pace, not in a hot loop."""
    pod = Pod.objects.select_related("pool").reachable_here().filter(pk=pod_id, terminate_pending=True).first()
    if pod is None or pod.is_alive or pod.step_at is None:
        return  # another host's local pod is that host's to terminate: its pid means nothing here
    now = timezone.now()
    waited = (now - (pod.ended_at or now)).total_seconds()
    retry_at = now + timedelta(seconds=min(max(waited, TERMINATE_RETRY_MIN_SECONDS), TERMINATE_RETRY_MAX_SECONDS))
    claimed = Pod.objects.filter(pk=pod_id, terminate_pending=True, step_at=pod.step_at).update(step_at=retry_at)
    if not claimed:
        return  # another pass took this try
    try:
        get_provider(pod.pool.provider).terminate(pod.provider_id)
    except ProviderError as exc:
        log.warning("terminating %s failed: %s; trying again at %s", pod.name, exc, retry_at.isoformat())
        return
    Pod.objects.filter(pk=pod_id, step_at=retry_at).update(terminate_pending=False, step_at=None)
    log.info("pod %s terminated at %s", pod.name, pod.pool.provider)


def pod_drain(*, pod_id: int, error: str) -> bool:
    """A ready pod that fails gets no more pages; the scaler releases it once none of its pages
    runs, and hears of it now. False if the pod was not ready (drained already, or ended)."""
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


def terminate_quietly(provider: Provider, pod: Pod) -> None:
    if not pod.provider_id:
        return
    try:
        provider.terminate(pod.provider_id)
    except ProviderError as exc:
        log.error("terminating %s failed: %s (reconcile will try again)", pod.name, exc)


def _requeue_pages_of(pod: Pod) -> int:
    return hooks.jobs().pod_lost(pod_id=pod.pk)
