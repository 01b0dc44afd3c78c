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
from django.utils import timezone

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


class BootFailed(Exception):
    pass


def pod_is_serving(base_url: str, *, timeout: float = 2.0) -> bool:
    """The pod server answers /healthz and says its engine is ready."""
    try:
        with httpx.Client(timeout=timeout) as client:
            if client.get(f"{base_url}/healthz").status_code != 200:
                return False
            return bool(client.get(f"{base_url}/v1/models").json().get("ready"))
    except (httpx.HTTPError, ValueError):
        return False


# --- boot ----------------------------------------------------------------------------------------


def pod_boot(*, pod_id: int) -> Pod:
    """Create the pod on the cheapest candidate with capacity, wait until it serves, join it.

    Safe to run again for the same pod (a worker killed mid-boot is retried):
    a pod already created, or created under its name before a crash, is waited
    for, not created twice. Each stage has its own time limit, counted from the
    pod's creation so that a retried boot keeps them.
    """
    pod = Pod.objects.select_related("pool").get(pk=pod_id)
    if pod.state != Pod.State.BOOTING:
        return pod
    provider = get_provider(pod.pool.provider)
    try:
        if not pod.provider_id:
            _adopt_by_name(pod, provider) or _create_on_a_candidate(pod, provider)
        seen = _wait_until_serving(pod, provider)
    except (BootFailed, ProviderError, PoolConfigError) as exc:
        log.warning("boot of %s failed: %s", pod.name, exc)
        if isinstance(exc, AuthFailed):  # refused before any create, e.g. on the catalogue
            Alert.raise_(pool=pod.pool, kind=Alert.Kind.AUTH, message=f"{provider.name}: {exc}")
        _terminate_quietly(provider, pod)
        pod.mark_ended(Pod.State.FAILED, error=str(exc))
        return pod
    with transaction.atomic():
        # A release may have been asked while we waited: then we do not join.
        current = Pod.objects.select_for_update().get(pk=pod.pk)
        if current.state != Pod.State.BOOTING:
            _terminate_quietly(provider, pod)
            return current
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
    while True:
        blocked = capacity.blocked_keys(keys)
        waited_on = 0
        for offer, key in zip(candidates, keys, strict=True):
            if key in blocked:
                continue
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
            raise BootFailed(f"no capacity on any of the {len(candidates)} candidates")
        if time.monotonic() > deadline:
            raise BootFailed(f"no candidate free after {settings.POD_CREATE_TIMEOUT_SECONDS:.0f} s")
        time.sleep(0.1)


def _attempt(pod: Pod, key: str, outcome: str, error: Exception | None, started: float) -> None:
    BootAttempt.objects.create(
        pod=pod, candidate=key, outcome=outcome, error=str(error or "")[:2000], seconds=time.monotonic() - started
    )


def _wait_until_serving(pod: Pod, provider: Provider) -> ProviderPod:
    """Stage 2: the provider runs it and exposes its port. Stage 3: its model is loaded."""
    begun = pod.billed_from or pod.created_at
    running_by = begun + timezone.timedelta(seconds=settings.POD_RUNNING_TIMEOUT_SECONDS)
    while True:
        seen = provider.get(pod.provider_id)
        if seen is None:
            raise BootFailed("the pod went away while booting")
        if seen.running and seen.base_url:
            break
        if timezone.now() > running_by:
            raise BootFailed(f"not running after {settings.POD_RUNNING_TIMEOUT_SECONDS:.0f} s")
        time.sleep(0.2)
    ready_by = timezone.now() + timezone.timedelta(seconds=settings.POD_READY_TIMEOUT_SECONDS)
    while not pod_is_serving(seen.base_url):
        if timezone.now() > ready_by:
            raise BootFailed(f"its model was not ready {settings.POD_READY_TIMEOUT_SECONDS:.0f} s after it ran")
        time.sleep(0.2)
        if provider.get(pod.provider_id) is None:
            raise BootFailed("the pod went away while loading its model")
    return seen


def _terminate_quietly(provider: Provider, pod: Pod) -> None:
    if not pod.provider_id:
        return
    try:
        provider.terminate(pod.provider_id)
    except ProviderError as exc:
        log.error("terminating %s failed: %s (reconcile will try again)", pod.name, exc)


# --- release -------------------------------------------------------------------------------------


def pod_release(*, pod: Pod, reason: str) -> Pod:
    """Attribute spend, terminate at the provider, free its pages. Idempotent."""
    if not pod.is_alive:
        return pod
    with transaction.atomic():
        # Ended first: a boot still waiting on this pod sees it and does not join.
        pod.mark_ended(Pod.State.TERMINATED, error=f"released: {reason}")
        _requeue_pages_of(pod)
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
            _enqueue_boots([row.pk])
            result.adopted.append(seen.name)
            continue
        pool = _pool_from_name(seen.name)
        if row is None and pool is not None and pool.provider == provider_name and _pool_wants_one(pool):
            adopted = Pod.objects.create(
                pool=pool, name=seen.name, provider_id=provider_id, lanes=pool.lanes_per_pod,
                cost_per_hr=seen.cost_per_hr, billed_from=timezone.now(), reason=Pod.Reason.DEMAND,
            )  # fmt: skip
            _enqueue_boots([adopted.pk])
            result.adopted.append(seen.name)
            continue
        provider.terminate(provider_id)
        result.terminated.append(seen.name)
    for provider_id, pod in known.items():
        if pod.is_alive and provider_id not in remote:
            with transaction.atomic():
                pod.mark_ended(Pod.State.LOST, error="the provider no longer has this pod")
                _requeue_pages_of(pod)
            result.lost.append(pod.name)
    if result.adopted or result.terminated or result.lost:
        log.warning("reconcile %s: %s", provider_name, result)
    return result


def _pool_wants_one(pool: Pool) -> bool:
    wanted, serving, _ = pool_demand(pool)
    return serving < wanted


# --- the scaler tick -----------------------------------------------------------------------------


def pool_demand(pool: Pool) -> tuple[int, int, int]:
    """(pods wanted, pods booting or ready, pages waiting or running)."""
    from ocrjobs.models import Page

    pages = Page.objects.filter(pool=pool)
    demand = (
        pages.waiting().count() + pages.filter(status=Page.Status.RUNNING, claim_expires_at__gte=timezone.now()).count()
    )
    wanted = max(pool.min_pods, math.ceil(demand / pool.lanes_per_pod)) if demand else pool.min_pods
    serving = pool.pods.filter(state__in=[Pod.State.BOOTING, Pod.State.READY]).count()
    return min(wanted, pool.max_pods), serving, demand


@dataclass
class TickResult:
    pool: str
    waiting: int
    alive: int
    booted: list[int]
    shed: list[int]


def pool_tick(*, pool: Pool) -> TickResult:
    """Compare the pool's backlog with its pods: boot what is needed, shed what idles."""
    from ocrjobs.services import dispatch_ensure, pages_waiting

    booted: list[int] = []
    shed: list[int] = []
    with transaction.atomic():
        Pool.objects.select_for_update().filter(pk=pool.pk).first()  # one tick per pool at a time
        wanted, serving, demand = pool_demand(pool)
        booting = pool.pods.filter(state=Pod.State.BOOTING).count()
        to_boot = min(wanted - serving, pool.max_parallel_boots - booting)
        if to_boot > 0 and _auth_blocked(pool):
            log.warning("pool %s: not booting, the provider refused our credentials (see alerts)", pool.key)
            to_boot = 0
        for _ in range(max(0, to_boot)):
            # Booting pods count as capacity: the next tick must not boot them again.
            pod = Pod.objects.create(
                pool=pool,
                name=pod_name(pool, uuid.uuid4().hex[:8]),
                lanes=pool.lanes_per_pod,
                reason=Pod.Reason.DEMAND if demand else Pod.Reason.WARM,
            )
            booted.append(pod.pk)
        if booted:
            transaction.on_commit(lambda: _enqueue_boots(booted))
    for pod in pool.pods.filter(state=Pod.State.DRAINING).exclude(pages__status="running"):
        pod_release(pod=pod, reason="drained")
        shed.append(pod.pk)
    if not demand:
        idle_since = timezone.now() - timezone.timedelta(seconds=pool.idle_seconds)
        ready = list(pool.pods.filter(state=Pod.State.READY).order_by("last_busy_at"))
        for pod in ready[: max(0, len(ready) - pool.min_pods)]:
            if pod.last_busy_at is None or pod.last_busy_at < idle_since:
                pod_release(pod=pod, reason=f"idle for {pool.idle_seconds} s")
                shed.append(pod.pk)
    waiting = pages_waiting(pool_id=pool.pk)
    if waiting and pool.pods.filter(state=Pod.State.READY).exists():
        dispatch_ensure(pool=pool)
    return TickResult(pool.key, waiting, serving + len(booted), booted, shed)


def _auth_blocked(pool: Pool) -> bool:
    recent = timezone.now() - timezone.timedelta(seconds=settings.AUTH_RETRY_SECONDS)
    return Alert.objects.filter(
        pool__provider=pool.provider, kind=Alert.Kind.AUTH, resolved_at__isnull=True, updated_at__gte=recent
    ).exists()


def _enqueue_boots(pod_ids: list[int]) -> None:
    from django_q.tasks import async_task

    for pod_id in pod_ids:
        async_task("pods.tasks.boot_pod", pod_id, task_name=f"boot pod {pod_id}", group="boots")
