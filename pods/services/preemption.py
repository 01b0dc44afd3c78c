"""Interruptible (spot) pods: what happens when the provider takes one back, and how often it does.

A preempted pod is lost to us: it ends (its spend runs to the preemption, not to when we
noticed), its pages wait again without spending an attempt (the page did nothing wrong), and
its candidate is skipped by every boot for the pool's ``preempted_skip_seconds``, as a "no
capacity" answer is: the market there has just outbid us. The pass that notices is reconcile
(every scaler tick), a boot step, or the dispatcher: a pod that stops answering it is asked about
at the provider at once (``pod_address`` … ``pod_preempted_if_stopped``), not left until the next
tick, so that its pages wait again and its replacement boots within a second of the first failure.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from pods import capacity, hooks, planning
from pods.models import Alert, Pod, Pool
from pods.poolconfig import PoolConfigError, RunPodPoolConfig, parse_config
from pods.providers import get_provider
from pods.providers.base import Offer, ProviderError, ProviderPod, StopCause
from pods.services.autostop import autostopped_if_expired
from pods.services.lifecycle import pod_end

log = logging.getLogger(__name__)

DEFAULT_WINDOW_HOURS = 6.0
PREEMPTED_ERROR = "preempted: the provider took this interruptible pod back"
STOPPED_FOR_BALANCE = "stopped by the provider: the account's balance ran out"
STOPPED_BY_PROVIDER = "stopped by the provider (an image that does not pull, or a host fault): not a preemption"


def pod_preempted(*, pod: Pod, at: datetime | None = None) -> bool:
    """Record that the provider preempted ``pod`` at ``at`` (default now). False if it had ended
    already (a release, a loss or an earlier preemption came first: it is ended once)."""
    now = timezone.now()
    at = min(at or now, now)
    if pod.billed_from is not None:
        at = max(at, pod.billed_from)
    with transaction.atomic():
        current = Pod.objects.select_for_update().select_related("pool").filter(pk=pod.pk).first()
        if current is None or not current.is_alive:
            return False
        current.preempted_at = current.ended_at = at  # mark_ended keeps it: the spend runs to here
        current.save(update_fields=["preempted_at", "ended_at"])
        _requeue_pages(current, at)  # before pod_end's own requeue, which would keep the attempts
        pod_end(pod=current, state=Pod.State.FAILED, error=PREEMPTED_ERROR)
        pod.refresh_from_db()
    _skip_candidate(current)
    log.warning("pod %s preempted at %s", current.name, at.isoformat())
    return True


PREEMPTED, STOPPED = "preempted", "stopped"


def preempted_if_stopped(pod: Pod, seen: ProviderPod) -> str:
    """Act on a stop the provider reports, by its cause (``seen.stop_cause``, from RunPod's
    ``lastStatusChange``): PREEMPTED or STOPPED if the pod ended here, else "":

    - outbid (an interruptible pod; "Outbid:" on the EXITED or TERMINATED path): preempted, at its
      last status change; a stop that names no cause, on an interruptible pod, as possibly one;
    - stopped by the provider for the account's balance: the pod fails, and an alert stops new
      boots (scaler ``_balance_blocked``) until a pod is had again;
    - stopped by the provider for anything else (an image that does not pull, a host fault): the
      pod fails with that said, never counted as a preemption (its candidate is not skipped, its
      pages' attempts are spent: a bad image would otherwise be "preempted" again and again);
    - stopped by a person with the key: a booting pod fails; a joined one is left to the person.
    """
    if not seen.stopped:
        return ""
    cause = seen.stop_cause
    at = timezone.now() - timedelta(seconds=seen.age_seconds)
    if pod.interruptible and cause in (StopCause.OUTBID, StopCause.UNKNOWN, ""):
        pod_preempted(pod=pod, at=at)
        return PREEMPTED
    if cause == StopCause.BALANCE:
        Alert.raise_(pool=pod.pool, kind=Alert.Kind.BALANCE, message=f"{pod.name}: {STOPPED_FOR_BALANCE}")
        pod_end(pod=pod, state=Pod.State.FAILED, error=STOPPED_FOR_BALANCE)
        return STOPPED
    if cause in (StopCause.PROVIDER, StopCause.UNKNOWN, StopCause.OUTBID):
        pod_end(pod=pod, state=Pod.State.FAILED, error=STOPPED_BY_PROVIDER)
        return STOPPED
    if pod.state == Pod.State.BOOTING:
        pod_end(pod=pod, state=Pod.State.FAILED, error="stopped by the account while booting")
        return STOPPED
    return ""


def pod_vanished(pod: Pod) -> None:
    """The provider no longer has the pod (nor says why): an interruptible one was possibly preempted
    (RunPod's outbid on the TERMINATED path leaves the listing at once, review row 5); any other
    is lost. Either way its pages wait again."""
    if pod.interruptible:
        pod_preempted(pod=pod)
    else:
        pod_end(pod=pod, state=Pod.State.LOST, error="the provider no longer has this pod")


def pod_address(*, pod_id: int) -> tuple[str, str] | None:
    """(provider, provider id) of an alive interruptible pod, the question the dispatcher asks the
    provider when it stops answering; None for any other pod (its failures are counted instead)."""
    pod = Pod.objects.alive().filter(pk=pod_id, interruptible=True).exclude(provider_id="")
    return pod.values_list("pool__provider", "provider_id").first()


def provider_pod(provider_name: str, provider_id: str) -> ProviderPod | None:
    """The provider's view of one pod (a blocking call: the dispatcher runs it on a thread of its
    own, never on its database thread). None if it has none, or cannot say now."""
    try:
        return get_provider(provider_name).get(provider_id)
    except ProviderError as exc:
        log.warning("asking %s about pod %s: %s", provider_name, provider_id, exc)
        return None


def pod_preempted_if_stopped(*, pod_id: int, seen: ProviderPod) -> bool:
    """``preempted_if_stopped`` for the pod with this id; also True (it ended) for a pod that
    stopped itself while nobody here spoke to it (autostop: its end, not a preemption)."""
    pod = Pod.objects.select_related("pool").filter(pk=pod_id).first()
    if pod is None or not pod.is_alive:
        return False
    if seen.stopped and autostopped_if_expired(pod):
        return True
    return bool(preempted_if_stopped(pod, seen))


def fleet_before_preemption(pool: Pool, *, now: datetime | None = None) -> int:
    """Pods the pool had (alive or booting, the preempted included) when a preemption came within its
    ``preempted_skip_seconds``; the most over those preemptions, 0 if none. The scaler keeps that
    many while pages wait: sized from now, the work left wants fewer pods than the whole did, and a
    preempted pod was never replaced (a full storm, 2 of 5 pods preempted at half: 217 s → 341 s)."""
    now = now or timezone.now()
    config = _config(pool)
    seconds = config.preempted_skip_seconds if config is not None else settings.CAPACITY_VERDICT_TTL_SECONDS
    pods = Pod.objects.filter(pool_id=pool.pk)
    moments = pods.filter(preempted_at__gt=now - timedelta(seconds=seconds)).values_list("preempted_at", flat=True)
    return max(
        (pods.filter(Q(ended_at__isnull=True) | Q(ended_at__gte=at), created_at__lte=at).count() for at in moments),
        default=0,
    )


def on_demand_floor_unmet(pod: Pod, floor: int) -> bool:
    """Whether the pool has fewer on-demand pods than its floor: then this boot rents one, and only
    the pods above the floor are interruptible. Counted: alive pods whose create is out or done
    (a boot's kind is written before its create call)."""
    if floor <= 0:
        return False
    others = Pod.objects.alive().filter(pool_id=pod.pool_id, interruptible=False).exclude(pk=pod.pk)
    return others.exclude(boot_stage=Pod.BootStage.CREATE).count() < floor


def _requeue_pages(pod: Pod, at: datetime) -> int:
    return hooks.jobs().pod_preempted(pod_id=pod.pk, at=at)


def _config(pool: Pool) -> RunPodPoolConfig | None:
    try:
        return parse_config(pool.provider, pool.config)
    except PoolConfigError:
        return None


def _skip_candidate(pod: Pod) -> None:
    config = _config(pod.pool)
    seconds = config.preempted_skip_seconds if config is not None else settings.CAPACITY_VERDICT_TTL_SECONDS
    offer = Offer(pod.gpu_type, pod.cloud_type, pod.data_center, interruptible=True)
    capacity.candidate_block(
        planning.candidate_key(pod.pool.provider, offer), seconds=seconds, reason=f"{pod.name} was preempted"
    )


@dataclass(frozen=True)
class PreemptionRate:
    preemptions: int
    pod_hours: float  # interruptible pods' billed hours in the window
    hours: float  # the window

    @property
    def per_pod_hour(self) -> float:
        return self.preemptions / self.pod_hours if self.pod_hours > 0 else 0.0

    def to_dict(self) -> dict:
        return {
            "preemptions": self.preemptions,
            "interruptible_pod_hours": round(self.pod_hours, 3),
            "per_pod_hour": round(self.per_pod_hour, 4),
            "over_hours": self.hours,
        }


def preemption_rate(pool: Pool, *, hours: float | None = None, now: datetime | None = None) -> PreemptionRate:
    """Preemptions per pod-hour of the pool's interruptible pods, measured over its last ``hours``
    (its config's ``preemption_window_hours``): preempted pods ÷ the hours its interruptible pods
    were billed then."""
    if hours is None:
        config = _config(pool)
        hours = config.preemption_window_hours if config is not None else DEFAULT_WINDOW_HOURS
    now = now or timezone.now()
    since = now - timedelta(hours=hours)
    pods = Pod.objects.filter(pool_id=pool.pk, interruptible=True, billed_from__isnull=False).filter(
        Q(ended_at__isnull=True) | Q(ended_at__gt=since)
    )
    preemptions, seconds = 0, 0.0
    for billed_from, ended_at, preempted_at in pods.values_list("billed_from", "ended_at", "preempted_at"):
        seconds += max(0.0, ((ended_at or now) - max(billed_from, since)).total_seconds())
        preemptions += preempted_at is not None and preempted_at > since
    return PreemptionRate(preemptions, seconds / 3600, hours)
