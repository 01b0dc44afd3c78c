"""Autostop (issue 39, invariant 21): a pod the control plane has not spoken to for its pool's
``autostop_seconds`` (as it was when the pod was booted: ``Pod.autostop``) stops itself, so no GPU bills while every control-plane process is gone.

The pod server exits when nobody with its token has asked it anything for the interval (as
SkyPilot's autostop does), and with it the pod's container: RunPod stops billing the GPU of a
pod whose container exited, a local pod's process is gone, and the simulator marks it EXITED.
While the control plane runs, a pass speaks to every joined pod at a third of the interval
(``keepalive_step``), and boot steps speak to booting ones, so a pod stops only when no pass has
run for the whole interval. Such a stop is the pod's end, not a failure: when the control plane
comes back, reconcile (or the pod's boot step) finds it stopped or gone after the interval had
passed since it last spoke to it, and ends it as TERMINATED with its spend up to when it stopped,
its pages in flight waiting again with their attempts given back (``pod_autostopped``).
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.db import transaction
from django.utils import timezone

from pods import hooks
from pods.models import Pod, Pool
from pods.podclient import pod_keepalive
from pods.services.lifecycle import pod_end

log = logging.getLogger(__name__)

KEEPALIVES_PER_INTERVAL = 3  # a pod is spoken to this many times within its autostop interval
KEEPALIVE_TIMEOUT_SECONDS = 5.0  # one short look: a pod that does not answer is the dispatcher's to judge
AUTOSTOPPED_ERROR = "autostopped: the control plane had not spoken to it for {seconds} s"


def keepalive_period(pod: Pod) -> timedelta:
    return timedelta(seconds=pod.autostop / KEEPALIVES_PER_INTERVAL)


def pod_contacted(*, pod: Pod, at: datetime | None = None) -> None:
    """The control plane spoke to the pod at ``at`` (default now): its next keepalive is due a
    period later."""
    at = at or timezone.now()
    pod.contacted_at, pod.keepalive_at = at, at + keepalive_period(pod)
    Pod.objects.filter(pk=pod.pk).update(contacted_at=pod.contacted_at, keepalive_at=pod.keepalive_at)


def keepalives_waiting(now: datetime):
    return Pod.objects.filter(state__in=(Pod.State.READY, Pod.State.DRAINING), keepalive_at__lte=now)


def keepalives_due(*, now: datetime, limit: int) -> list[int]:
    """Joined pods this host reaches whose keepalive is due, longest waiting first."""
    due = keepalives_waiting(now).exclude(base_url="").reachable_here()
    return list(due.order_by("keepalive_at").values_list("pk", flat=True)[:limit])


def keepalive_step(pod_id: int) -> None:
    """Speak to one joined pod (its /healthz, with its token), so that it does not stop itself.
    The try is claimed first by moving ``keepalive_at`` a period on: two passes never both call,
    and a pod that does not answer is asked again a period later (its failures are the
    dispatcher's to count: a keepalive never drains or ends a pod)."""
    pod = Pod.objects.select_related("pool").filter(pk=pod_id).first()
    if pod is None or pod.keepalive_at is None or pod.state not in (Pod.State.READY, Pod.State.DRAINING):
        return
    now = timezone.now()
    claimed = Pod.objects.filter(pk=pod_id, keepalive_at=pod.keepalive_at).update(
        keepalive_at=now + keepalive_period(pod)
    )
    if not claimed:
        return
    if pod_keepalive(pod.base_url, token=pod.token, timeout=KEEPALIVE_TIMEOUT_SECONDS):
        Pod.objects.filter(pk=pod_id).update(contacted_at=now)
    else:
        log.warning("pod %s did not answer its keepalive", pod.name)


def last_spoken_to(pod: Pod) -> datetime | None:
    """The latest moment the control plane is known to have spoken to the pod."""
    moments = [m for m in (pod.contacted_at, pod.last_busy_at, pod.ready_at, pod.billed_from) if m is not None]
    return max(moments, default=None)


def autostop_expired(pod: Pod, *, now: datetime | None = None) -> bool:
    """Whether the pod may have stopped itself: nobody here spoke to it for its pool's interval.
    A pod that stops or vanishes sooner than that failed (or was preempted): it is not this."""
    last = last_spoken_to(pod)
    now = now or timezone.now()
    return last is not None and (now - last).total_seconds() >= pod.autostop


def pod_autostopped(*, pod: Pod, now: datetime | None = None) -> bool:
    """Record that the pod stopped itself: its spend runs to when it stopped (its last contact
    plus the interval), its pages in flight wait again with their attempts given back (the
    pages did nothing wrong, nor did the pod), and it ends as TERMINATED, not FAILED: no failure
    verdict on its GPU type, no preemption. False if it had ended already."""
    now = now or timezone.now()
    with transaction.atomic():
        current = Pod.objects.select_for_update().select_related("pool").filter(pk=pod.pk).first()
        if current is None or not current.is_alive:
            return False
        stopped_at = min(now, (last_spoken_to(current) or now) + timedelta(seconds=current.autostop))
        if current.billed_from is not None:
            stopped_at = max(stopped_at, current.billed_from)
        current.ended_at = stopped_at  # mark_ended keeps it: the spend runs to here
        current.save(update_fields=["ended_at"])
        _requeue_pages(current)  # before pod_end's own requeue, which would keep the attempts
        pod_end(
            pod=current,
            state=Pod.State.TERMINATED,
            error=AUTOSTOPPED_ERROR.format(seconds=current.autostop),
        )
    pod.refresh_from_db()
    log.warning("pod %s stopped itself (autostop) at %s", current.name, stopped_at.isoformat())
    return True


def autostopped_if_expired(pod: Pod, *, now: datetime | None = None) -> bool:
    """``pod_autostopped`` for a pod found stopped or gone, if its autostop interval had passed."""
    return autostop_expired(pod, now=now) and pod_autostopped(pod=pod, now=now)


def _requeue_pages(pod: Pod) -> int:
    return hooks.jobs().pod_preempted(pod_id=pod.pk)


def paid_pods_up() -> list[tuple[Pod, datetime]]:
    """The pods a provider may still bill us for, as this database knows them (alive pods of
    pools that rent, and ended ones whose terminate the provider has not confirmed), each with
    the moment it stops itself at the latest if nobody speaks to it: what ``manage.py up`` says
    when it stops (issue 39: stopping it once left four paid pods running without a word)."""
    up = Pod.objects.exclude(pool__provider=Pool.Provider.LOCAL).exclude(provider_id="").select_related("pool")
    pods = up.filter(state__in=Pod.ALIVE_STATES) | up.filter(terminate_pending=True)
    return [
        (pod, (last_spoken_to(pod) or pod.created_at) + timedelta(seconds=pod.autostop))
        for pod in pods.order_by("pool__key", "name")
    ]
