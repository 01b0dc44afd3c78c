"""Actions on pools and pods: boot, release, reconcile, and the scaler tick.

Everything here blocks (provider calls, HTTP to pods): it runs in django-q2
workers, never in the front's request path.
"""

from __future__ import annotations

import logging
import math
import time
import uuid
from dataclasses import dataclass, field

import httpx
from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from fleetadmin import leases
from pods import capacity
from pods.models import Alert, BootAttempt, Pod, Pool, pod_name
from pods.poolconfig import PoolConfigError, pool_offers
from pods.providers import get_provider
from pods.providers.base import (
    AuthFailed,
    NoCapacity,
    PodSpec,
    Provider,
    ProviderError,
    ProviderPod,
    Transient,
    UnknownOffer,
)

log = logging.getLogger(__name__)

UNKNOWN_OFFER_BLOCK_SECONDS = 3600.0
# A shed tick waits in a worker at most this long; later sheds are the schedule's.
SHED_TICK_HORIZON_SECONDS = 90.0
SHED_TICK_MARGIN_SECONDS = 0.5


class BootFailed(Exception):
    pass


class BootCancelled(BootFailed):
    """A shed asked this anticipatory boot to stop before it joins."""


def _check_cancelled(pod: Pod) -> None:
    """Between every step of a boot: renew its lease, and stop if the boot is no longer wanted."""
    leases.renew(Pod.objects.filter(pk=pod.pk), pod.task_lease_token)
    state, cancel = Pod.objects.filter(pk=pod.pk).values_list("state", "cancel_requested_at").get()
    if cancel is not None:
        raise BootCancelled("cancelled by a shed before it joined")
    if state != Pod.State.BOOTING:
        raise BootCancelled(f"released while booting ({state})")


def pod_engine(base_url: str, *, timeout: float = 2.0) -> dict | None:
    """What the pod's /v1/models says once /healthz answers and its engine is ready; else None."""
    try:
        with httpx.Client(timeout=timeout) as client:
            if client.get(f"{base_url}/healthz").status_code != 200:
                return None
            models = client.get(f"{base_url}/v1/models").json()
    except (httpx.HTTPError, ValueError):
        return None
    return models if isinstance(models, dict) and models.get("ready") else None


def pod_is_serving(base_url: str, *, timeout: float = 2.0) -> bool:
    return pod_engine(base_url, timeout=timeout) is not None


# --- boot ----------------------------------------------------------------------------------------


def pod_boot(*, pod_id: int) -> Pod:
    """Create the pod on the cheapest candidate with capacity, wait until it serves, join it.

    Safe to run again for the same pod (a worker killed mid-boot is retried):
    a pod already created, or created under its name before a crash, is waited
    for, not created twice. Each stage has its own time limit, counted from the
    pod's creation so that a retried boot keeps them.
    """
    row = Pod.objects.filter(pk=pod_id, state=Pod.State.BOOTING)
    lease = leases.acquire(row)
    if lease is None:
        log.info("pod %s: booted already, or another task is booting it", pod_id)
        return Pod.objects.select_related("pool").get(pk=pod_id)
    try:
        return _boot(Pod.objects.select_related("pool").get(pk=pod_id))
    except leases.LeaseLost:
        log.warning("pod %s: another task took over its boot", pod_id)
        return Pod.objects.select_related("pool").get(pk=pod_id)
    finally:
        # Expired now: if it is still booting, the next scaler tick sends it again.
        leases.release(Pod.objects.filter(pk=pod_id), lease)


def _boot(pod: Pod) -> Pod:
    provider = get_provider(pod.pool.provider)
    try:
        if not pod.provider_id:
            _adopt_by_name(pod, provider) or _create_on_a_candidate(pod, provider)
        seen, engine = _wait_until_serving(pod, provider)
    except (BootFailed, ProviderError, PoolConfigError) as exc:
        log.warning("boot of %s failed: %s", pod.name, exc)
        if isinstance(exc, AuthFailed):  # refused before any create, e.g. on the catalogue
            Alert.raise_(pool=pod.pool, kind=Alert.Kind.AUTH, message=f"{provider.name}: {exc}")
        _terminate_quietly(provider, pod)
        pod.refresh_from_db()
        if pod.is_alive:
            cancelled = isinstance(exc, BootCancelled)
            pod_end(pod=pod, state=Pod.State.TERMINATED if cancelled else Pod.State.FAILED, error=str(exc))
        return pod
    with transaction.atomic():
        # A release or a shed may have been asked while we waited: then we do not join.
        current = Pod.objects.select_for_update().get(pk=pod.pk)
        if current.state != Pod.State.BOOTING or current.cancel_requested_at is not None:
            _terminate_quietly(provider, pod)
            if current.is_alive:
                pod_end(pod=current, state=Pod.State.TERMINATED, error="cancelled by a shed before it joined")
            return current
        pod.engine = engine
        pod.save(update_fields=["engine"])
        pod.mark_ready(base_url=seen.base_url)
    log.info("pod %s ready at %s", pod.name, pod.base_url)
    from ocrjobs.services import dispatch_ensure, pages_waiting

    if pages_waiting(pool_id=pod.pool_id):
        dispatch_ensure(pool=pod.pool)
    return pod


def _adopt_by_name(pod: Pod, provider: Provider) -> bool:
    """A boot that died after its create but before saving left a pod under this name."""
    for found in provider.list(prefix=pod.name):
        if found.name == pod.name:
            _save_created(pod, found, None)
            log.warning("boot of %s: adopted %s, created by an earlier try", pod.name, found.provider_id)
            return True
    return False


def _save_created(pod: Pod, created: ProviderPod, offer) -> None:
    pod.provider_id = created.provider_id
    pod.billed_from = pod.billed_from or timezone.now()
    fields = ["provider_id", "billed_from"]
    if offer is not None:
        pod.gpu_type, pod.cloud_type, pod.data_center = offer.gpu_type, offer.cloud_type, offer.data_center
        pod.cost_per_hr = created.cost_per_hr or offer.cost_per_hr
        fields += ["gpu_type", "cloud_type", "data_center", "cost_per_hr"]
    pod.save(update_fields=fields)


def _create_on_a_candidate(pod: Pod, provider: Provider) -> None:
    """Walk the pool's candidates cheapest first; each candidate is probed by one boot at a time
    and skipped by every boot while its "no capacity" verdict lasts."""
    pool = pod.pool
    offers, config = pool_offers(pool)
    catalogue = capacity.catalogue_get(provider.name).offers if config is not None else offers
    candidates = capacity.priced(offers, catalogue)
    keys = [capacity.candidate_key(provider.name, offer) for offer in candidates]
    deadline = time.monotonic() + settings.POD_CREATE_TIMEOUT_SECONDS
    errors: dict[str, str] = {}  # candidate -> the last error other than "no capacity"
    while True:
        blocked = capacity.blocked_keys(keys)
        waited_on = 0
        for offer, key in zip(candidates, keys, strict=True):
            if key in blocked:
                continue
            _check_cancelled(pod)  # released or shed while we walked: create nothing
            if not capacity.probe_acquire(key):
                waited_on += 1  # another boot is trying it right now
                continue
            spec = PodSpec(
                name=pod.name,
                lanes=pod.lanes,
                offer=offer,
                image=config.image if config else "",
                ports=config.ports if config else "",
                env=config.env if config else {},
                page_timeout=settings.PAGE_TIMEOUT_SECONDS,
            )
            started = time.monotonic()
            try:
                created = provider.create(spec)
            except NoCapacity as exc:
                errors.pop(key, None)
                _attempt(pod, key, BootAttempt.Outcome.NO_CAPACITY, exc, started)
                capacity.probe_finish(key, blocked_for=settings.CAPACITY_VERDICT_TTL_SECONDS, reason=str(exc))
                continue
            except UnknownOffer as exc:
                _attempt(pod, key, BootAttempt.Outcome.UNKNOWN_OFFER, exc, started)
                capacity.probe_finish(key, blocked_for=UNKNOWN_OFFER_BLOCK_SECONDS, reason=str(exc))
                Alert.raise_(pool=pool, kind=Alert.Kind.CONFIG, message=f"{key}: {exc}")
                continue
            except AuthFailed as exc:
                _attempt(pod, key, BootAttempt.Outcome.AUTH_FAILED, exc, started)
                capacity.probe_finish(key)
                Alert.raise_(pool=pool, kind=Alert.Kind.AUTH, message=f"{provider.name}: {exc}")
                raise BootFailed(f"the provider refused our credentials: {exc}") from None
            except Transient as exc:
                _attempt(pod, key, BootAttempt.Outcome.TRANSIENT, exc, started)
                capacity.probe_finish(key)
                errors[key] = str(exc)
                continue
            except ValueError as exc:  # a value the SDK cannot send safely
                _attempt(pod, key, BootAttempt.Outcome.INVALID, exc, started)
                capacity.probe_finish(key)
                Alert.raise_(pool=pool, kind=Alert.Kind.CONFIG, message=str(exc))
                raise BootFailed(str(exc)) from None
            except BaseException:
                capacity.probe_finish(key)
                raise
            _save_created(pod, created, offer)
            _attempt(pod, key, BootAttempt.Outcome.CREATED, None, started)
            capacity.probe_finish(key)
            Alert.resolve(pool=pool, kind=Alert.Kind.AUTH)
            return
        if not waited_on:
            raise BootFailed(_none_created(len(candidates), errors))
        if time.monotonic() > deadline:
            raise BootFailed(f"no candidate free after {settings.POD_CREATE_TIMEOUT_SECONDS:.0f} s")
        time.sleep(0.1)


def _none_created(candidates: int, errors: dict[str, str]) -> str:
    """Why a walk of every candidate created no pod: no capacity, or errors (not the same thing)."""
    if not errors:
        return f"no capacity on any of the {candidates} candidates"
    key, error = list(errors.items())[-1]
    others = candidates - len(errors)
    return (
        f"{len(errors)} of the {candidates} candidates failed with errors (last, {key}: {error})"
        + (f"; no capacity on the other {others}" if others else "")
    )[:2000]


def _attempt(pod: Pod, key: str, outcome: str, error: Exception | None, started: float) -> None:
    BootAttempt.objects.create(
        pod=pod, candidate=key, outcome=outcome, error=str(error or "")[:2000], seconds=time.monotonic() - started
    )


def _wait_until_serving(pod: Pod, provider: Provider) -> tuple[ProviderPod, dict]:
    """Stage 2: the provider runs it and exposes its port. Stage 3: its model is loaded.
    A shed may stop an anticipatory boot at any check, and last of all before it joins."""
    begun = pod.billed_from or pod.created_at
    running_by = begun + timezone.timedelta(seconds=settings.POD_RUNNING_TIMEOUT_SECONDS)
    while True:
        _check_cancelled(pod)
        seen = provider.get(pod.provider_id)
        if seen is None:
            raise BootFailed("the pod went away while booting")
        if seen.running and seen.base_url:
            break
        if timezone.now() > running_by:
            raise BootFailed(f"not running after {settings.POD_RUNNING_TIMEOUT_SECONDS:.0f} s")
        time.sleep(settings.POD_POLL_SECONDS)
    ready_by = timezone.now() + timezone.timedelta(seconds=settings.POD_READY_TIMEOUT_SECONDS)
    while (engine := pod_engine(seen.base_url)) is None:
        _check_cancelled(pod)  # during model load
        if timezone.now() > ready_by:
            raise BootFailed(f"its model was not ready {settings.POD_READY_TIMEOUT_SECONDS:.0f} s after it ran")
        time.sleep(settings.POD_POLL_SECONDS)
        if provider.get(pod.provider_id) is None:
            raise BootFailed("the pod went away while loading its model")
    return seen, engine


def terminate_quietly(pod: Pod) -> None:
    _terminate_quietly(get_provider(pod.pool.provider), pod)


def pod_release_request(*, pod: Pod, reason: str) -> bool:
    """A release asked from the front: ended and its spend attributed now, in the database;
    terminated at the provider by a worker. False if it had already ended (idempotent)."""
    if not pod.is_alive:
        return False
    with transaction.atomic():
        current = Pod.objects.select_for_update().select_related("pool").get(pk=pod.pk)
        if not current.is_alive:
            return False
        pod_end(pod=current, state=Pod.State.TERMINATED, error=f"released: {reason}")
        transaction.on_commit(lambda: _enqueue("pods.tasks.terminate_at_provider", pod.pk, name=f"release {pod.name}"))
    return True


def _terminate_quietly(provider: Provider, pod: Pod) -> None:
    if not pod.provider_id:
        return
    try:
        provider.terminate(pod.provider_id)
    except ProviderError as exc:
        log.error("terminating %s failed: %s (reconcile will try again)", pod.name, exc)


# --- ending a pod --------------------------------------------------------------------------------


def pod_end(*, pod: Pod, state: str, error: str = "") -> Pod:
    """Record that a pod ended: its pages in flight wait again and its spend is attributed."""
    from pods.spend import spend_attribute

    with transaction.atomic():
        pod.mark_ended(state, error=error)
        _requeue_pages_of(pod)
        spend_attribute(pod)
    return pod


# --- release -------------------------------------------------------------------------------------


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


def _requeue_pages_of(pod: Pod) -> int:
    from ocrjobs.services import pages_requeue_from_pod

    return pages_requeue_from_pod(pod_id=pod.pk)


# --- reconcile -----------------------------------------------------------------------------------


@dataclass
class ReconcileResult:
    provider: str
    adopted: list[str] = field(default_factory=list)
    terminated: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)


def _pool_from_name(name: str) -> Pool | None:
    prefix = f"{settings.DEPLOYMENT_PREFIX}-"
    if not name.startswith(prefix) or "-" not in name[len(prefix) :]:
        return None
    key = name[len(prefix) :].rsplit("-", 1)[0]
    return Pool.objects.filter(key=key).first()


def reconcile(*, provider_name: str) -> ReconcileResult:
    """Make the database and the provider agree.

    - a pod at the provider that the database does not know, older than the
      grace period: adopted if its pool wants it, terminated otherwise;
    - a pod the database has but the provider no longer has: lost, its pages wait again;
    - a pod the database ended that still runs: terminated again.
    """
    provider = get_provider(provider_name)
    result = ReconcileResult(provider_name)
    remote = {p.provider_id: p for p in provider.list(prefix=f"{settings.DEPLOYMENT_PREFIX}-")}
    pods = Pod.objects.filter(pool__provider=provider_name).select_related("pool")
    known = {p.provider_id: p for p in pods.exclude(provider_id="")}
    for provider_id, seen in remote.items():
        pod = known.get(provider_id)
        if pod is not None:
            if not pod.is_alive:
                _terminate_quietly(provider, pod)
                result.terminated.append(seen.name)
            continue
        if seen.age_seconds < settings.RECONCILE_GRACE_SECONDS:
            continue  # its create may be saving right now
        row = pods.filter(name=seen.name).first()
        if row is not None and row.is_alive and not row.provider_id:
            _save_created(row, seen, None)  # the boot died between create and save
            Pod.objects.filter(pk=row.pk).update(**leases.queued())
            _enqueue_boots([row.pk])
            result.adopted.append(seen.name)
            continue
        pool = _pool_from_name(seen.name)
        if row is None and pool is not None and pool.provider == provider_name and _pool_wants_one(pool):
            adopted = Pod.objects.create(
                pool=pool, name=seen.name, provider_id=provider_id, lanes=pool.lanes_per_pod,
                cost_per_hr=seen.cost_per_hr, billed_from=timezone.now(), reason=Pod.Reason.DEMAND,
                **leases.queued(),
            )  # fmt: skip
            _enqueue_boots([adopted.pk])
            result.adopted.append(seen.name)
            continue
        provider.terminate(provider_id)
        result.terminated.append(seen.name)
    for provider_id, pod in known.items():
        if pod.is_alive and provider_id not in remote:
            pod_end(pod=pod, state=Pod.State.LOST, error="the provider no longer has this pod")
            result.lost.append(pod.name)
    if result.adopted or result.terminated or result.lost:
        log.warning("reconcile %s: %s", provider_name, result)
    return result


def _pool_wants_one(pool: Pool) -> bool:
    return pool_demand(pool).wanted > pool.pods.filter(state__in=[Pod.State.BOOTING, Pod.State.READY]).count()


# --- the scaler --------------------------------------------------------------------------------


@dataclass
class Demand:
    waiting: int  # pages waiting, from the database (each page once, however often it was tried)
    running: int
    seconds_per_page: float
    wanted: int  # pods, between the warm floor and max pods
    capped_jobs: list[int] = field(default_factory=list)
    affordable: int | None = None  # pods whose boots and idle tails the work pays for (None: no cap)


def seconds_per_page(pool: Pool) -> float:
    """Measured: the mean time of the pool's last pages on their pods; a setting until there are some."""
    from django.db.models import Avg

    from ocrjobs.models import Page

    recent = Page.objects.filter(pool=pool, status=Page.Status.DONE, seconds__isnull=False).order_by("-finished_at")
    ids = list(recent.values_list("id", flat=True)[:200])
    mean = Page.objects.filter(id__in=ids).aggregate(mean=Avg("seconds"))["mean"] if ids else None
    return float(mean) if mean else settings.SCALE_SECONDS_PER_PAGE_GUESS


def boot_seconds(pool: Pool) -> float:
    """Measured: the mean time from create to ready of the pool's last boots; a setting until there are some."""
    recent = pool.pods.filter(ready_at__isnull=False).order_by("-ready_at")[:20]
    times = [(p.ready_at - (p.billed_from or p.created_at)).total_seconds() for p in recent.only(
        "ready_at", "billed_from", "created_at")]  # fmt: skip
    return sum(times) / len(times) if times else settings.SCALE_BOOT_SECONDS_GUESS


def _jobs_over_budget(pool: Pool) -> list[int]:
    from ocrjobs.models import Job, Page
    from pods.spend import job_spend

    capped = Job.objects.filter(pool=pool, max_dollars__isnull=False).exclude(status__in=Job.FINISHED)
    capped = capped.filter(pk__in=Page.objects.waiting().filter(pool=pool).values("job_id"))
    return [job.pk for job in capped if job_spend(job.pk) >= job.max_dollars]


def pool_demand(pool: Pool) -> Demand:
    """Pods wanted: the work waiting (pages × measured seconds per page), spread over the
    lanes of a pod, drained within SCALE_TARGET_SECONDS; but no more pods than the work
    pays for (each costs its boot and its idle tail, which may add SCALE_MAX_OVERHEAD of
    the work at most); between the floor and max pods. Pages of jobs past their budget
    want no pod."""
    from ocrjobs.models import Page

    capped = _jobs_over_budget(pool)
    pages = Page.objects.filter(pool=pool).exclude(job_id__in=capped)
    waiting = pages.waiting().count()
    running = pages.filter(status=Page.Status.RUNNING, claim_expires_at__gte=timezone.now()).count()
    per_page = seconds_per_page(pool)
    work = (waiting + running) * per_page  # lane-seconds
    wanted = math.ceil(work / (pool.lanes_per_pod * settings.SCALE_TARGET_SECONDS)) if work else 0
    affordable = None
    fixed = boot_seconds(pool) + pool.idle_seconds  # pod-seconds each pod costs beyond its pages
    if settings.SCALE_MAX_OVERHEAD and fixed > 0:
        affordable = math.floor(settings.SCALE_MAX_OVERHEAD * work / pool.lanes_per_pod / fixed)
        wanted = min(wanted, affordable)
    if waiting and not wanted:
        wanted = 1
    wanted = min(max(wanted, pool.min_pods), pool.max_pods)
    return Demand(waiting, running, per_page, wanted, capped, affordable)


def dispatch_stalled(pool: Pool, demand: Demand) -> str:
    """Why dispatch looks stalled (pages waiting, lanes free, nothing started for a while), or ""."""
    from django.db.models import Max

    from ocrjobs.models import Page

    if not demand.waiting:
        return ""
    quiet = timezone.now() - timezone.timedelta(seconds=settings.STALL_SECONDS)
    ready = pool.pods.filter(state=Pod.State.READY)
    lanes = sum(ready.filter(ready_at__lt=quiet).values_list("lanes", flat=True))
    free = lanes - demand.running
    if free <= 0:
        return ""
    last_start = Page.objects.filter(pool=pool).aggregate(last=Max("started_at"))["last"]
    if last_start is not None and last_start >= quiet:
        return ""
    return (
        f"dispatch stalled: {demand.waiting} pages waiting, {free} lanes free on pods ready for over "
        f"{settings.STALL_SECONDS:.0f} s, no page started since {last_start.isoformat() if last_start else 'ever'}"
    )


def _budget_blocks(pool: Pool) -> str:
    """Why the pool's $/h cap blocks one more pod, or ""."""
    if pool.max_dollars_per_hour is None:
        return ""
    from decimal import Decimal

    current = sum(pool.pods.alive().exclude(billed_from=None).values_list("cost_per_hr", flat=True), Decimal(0))
    offers, config = pool_offers(pool)
    cheapest = Decimal(0)
    if config is not None:
        cached = capacity.catalogue_cached(pool.provider)
        priced = capacity.priced(offers, cached.offers if cached else [])
        cheapest = min((o.cost_per_hr for o in priced if o.cost_per_hr), default=Decimal(0))
    if current + cheapest > pool.max_dollars_per_hour:
        return f"budget cap: ${current}/h running + ${cheapest}/h for one more is over ${pool.max_dollars_per_hour}/h"
    return ""


@dataclass
class TickResult:
    pool: str
    waiting: int
    wanted: int
    serving: int
    booted: list[int]
    shed: list[int]
    boots_cancelled: int = 0
    blocked: str = ""


def pool_tick(*, pool: Pool, force_shed: bool = False) -> TickResult:
    """Compare the pool's backlog with its pods: boot what is needed, shed what is not.

    Booting pods count as capacity. A stalled pool is not grown (an alert is
    raised instead). A shed stops anticipatory boots first (warm floor, scale
    requests) and never a boot that waiting pages need; then it releases idle
    ready pods above the floor (``force_shed``: idle or not, but never one
    with a page running).
    """
    from ocrjobs.services import dispatch_ensure, pages_waiting

    pool.refresh_from_db()
    demand = pool_demand(pool)
    booted: list[int] = []
    shed: list[int] = []
    cancelled = 0
    blocked = ""
    with transaction.atomic():
        Pool.objects.select_for_update().filter(pk=pool.pk).first()  # one tick per pool at a time
        serving = list(pool.pods.filter(state__in=[Pod.State.BOOTING, Pod.State.READY], cancel_requested_at=None))
        booting = [p for p in serving if p.state == Pod.State.BOOTING]
        to_boot = min(demand.wanted - len(serving), pool.max_parallel_boots - len(booting))
        stalled = dispatch_stalled(pool, demand)
        if stalled:
            # More pods would not help a dispatch that does not start pages: say so instead.
            Alert.raise_(pool=pool, kind=Alert.Kind.STALL, message=stalled)
        else:
            Alert.resolve(pool=pool, kind=Alert.Kind.STALL)
        if to_boot > 0:
            blocked = stalled or _auth_blocked(pool) or _budget_blocks(pool)
            if blocked.startswith("budget"):
                Alert.raise_(pool=pool, kind=Alert.Kind.BUDGET, message=blocked)
            if blocked:
                log.warning("pool %s: not booting: %s", pool.key, blocked)
                to_boot = 0
        if not blocked.startswith("budget"):
            Alert.resolve(pool=pool, kind=Alert.Kind.BUDGET)
        for _ in range(max(0, to_boot)):
            pod = Pod.objects.create(
                pool=pool,
                name=pod_name(pool, uuid.uuid4().hex[:8]),
                lanes=pool.lanes_per_pod,
                reason=Pod.Reason.DEMAND if demand.waiting else Pod.Reason.WARM,
                **leases.queued(),
            )
            booted.append(pod.pk)
        if booted:
            transaction.on_commit(lambda: _enqueue_boots(booted))
        surplus = len(serving) - demand.wanted
        if surplus > 0:
            # Anticipatory boots first, newest first: they have cost the least so far.
            for pod in sorted(booting, key=lambda p: p.created_at, reverse=True):
                if surplus <= 0:
                    break
                if pod.reason != Pod.Reason.DEMAND:
                    Pod.objects.filter(pk=pod.pk).update(cancel_requested_at=timezone.now())
                    cancelled += 1
                    surplus -= 1
    for pod in pool.pods.filter(state=Pod.State.DRAINING).exclude(pages__status="running"):
        pod_release(pod=pod, reason="drained")
        shed.append(pod.pk)
    if surplus > 0:
        idle_since = timezone.now() - timezone.timedelta(seconds=pool.idle_seconds)
        busy = set(pool.pods.filter(pages__status="running").values_list("pk", flat=True))
        ready = pool.pods.filter(state=Pod.State.READY).order_by("last_busy_at")
        for pod in ready:
            if surplus <= 0:
                break
            idle = pod.last_busy_at is None or pod.last_busy_at < idle_since
            if pod.pk not in busy and (idle or force_shed):
                pod_release(pod=pod, reason="shed: idle" if idle else "shed: scale request")
                shed.append(pod.pk)
                surplus -= 1
            elif pod.pk not in busy:
                # Surplus, but not idle long enough yet: tick the moment it is, not a schedule later.
                _tick_when_sheddable(pool, pod.last_busy_at + timezone.timedelta(seconds=pool.idle_seconds))
                break
    if cancelled or shed:
        log.info("pool %s shed: stopped %d anticipatory boots, released %d pods", pool.key, cancelled, len(shed))
    waiting = pages_waiting(pool_id=pool.pk)
    if waiting and pool.pods.filter(state=Pod.State.READY).exists():
        dispatch_ensure(pool=pool)  # also replaces a dispatcher that died: a stall may be just that
    return TickResult(pool.key, waiting, demand.wanted, len(serving), booted, shed, cancelled, blocked)


def _tick_when_sheddable(pool: Pool, at) -> None:
    """Have a tick run at ``at``, when a surplus pod will have idled long enough, if that is
    sooner than the schedule would come (one such tick per pool, the earliest wins)."""
    now = timezone.now()
    if (at - now).total_seconds() > SHED_TICK_HORIZON_SECONDS:
        return  # the schedule comes before then
    at = max(at, now) + timezone.timedelta(seconds=SHED_TICK_MARGIN_SECONDS)
    due = Q(shed_tick_at__isnull=True) | Q(shed_tick_at__lt=now) | Q(shed_tick_at__gt=at)
    if Pool.objects.filter(pk=pool.pk).filter(due).update(shed_tick_at=at):
        _enqueue("pods.tasks.shed_tick", pool.pk, at.isoformat(), name=f"shed tick pool {pool.pk}")


def _auth_blocked(pool: Pool) -> str:
    recent = timezone.now() - timezone.timedelta(seconds=settings.AUTH_RETRY_SECONDS)
    refused = Alert.objects.filter(
        pool__provider=pool.provider, kind=Alert.Kind.AUTH, resolved_at__isnull=True, updated_at__gte=recent
    ).exists()
    return "the provider refused our credentials (see alerts)" if refused else ""


def _enqueue(func: str, *args, name: str) -> None:
    from django_q.tasks import async_task

    async_task(func, *args, task_name=name, group="scaler")


def boots_recover(*, pool: Pool) -> list[int]:
    """Send again the boot of every booting pod whose task never started or stopped
    renewing its lease (its worker was killed; the broker lost it). A boot is safe to
    run again: a pod already created is waited for, not created twice."""
    lost = list(leases.expired(pool.pods.filter(state=Pod.State.BOOTING)).values_list("pk", flat=True))
    if lost:
        Pod.objects.filter(pk__in=lost).update(**leases.queued())
        log.warning("pool %s: sending again %d boots whose tasks were lost", pool.key, len(lost))
        _enqueue_boots(lost)
    return lost


def _enqueue_boots(pod_ids: list[int]) -> None:
    from django_q.tasks import async_task

    for pod_id in pod_ids:
        async_task("pods.tasks.boot_pod", pod_id, task_name=f"boot pod {pod_id}", group="boots")


# --- scale requests ------------------------------------------------------------------------------


def scale_request_create(*, pool: Pool, pods: int | None = None, delta: int | None = None, by: str = ""):
    """Check a request to set the pool's size, store it and hand it to a worker."""
    from pods.models import ScaleRequest

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
        transaction.on_commit(lambda: _enqueue("pods.tasks.scale_pool", request.pk, name=f"scale {pool.key}"))
    return request


def scale_request_run(*, request_id: int, timeout: float | None = None):
    """Set the warm floor to the target, tick (booting or shedding at once), then wait until
    the pool's serving pods match the target or the boots fail."""
    from pods.models import ScaleRequest

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
