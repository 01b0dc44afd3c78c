"""Booting a pod: create it on the cheapest candidate with capacity, wait until it serves, join it.

Everything here blocks (provider calls, HTTP to pods): it runs in django-q2
workers, never in the front's request path.
"""

from __future__ import annotations

import logging
import time

import httpx
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from fleetadmin import leases
from ocrjobs import selectors
from pods import capacity
from pods.models import Alert, BootAttempt, Pod, Pool
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
from pods.services.lifecycle import _terminate_quietly, pod_end

log = logging.getLogger(__name__)

UNKNOWN_OFFER_BLOCK_SECONDS = 3600.0


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
    from ocrjobs.services.dispatchers import dispatch_ensure

    if selectors.pages_waiting(pool_id=pod.pool_id):
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


def boots_recover(*, pool: Pool) -> list[int]:
    """Send again the boot of every booting pod whose task never started or stopped
    renewing its lease (its worker was killed; the broker lost it). A boot is safe to
    run again: a pod already created is waited for, not created twice."""
    from pods.tasks import enqueue_boots

    lost = list(leases.expired(pool.pods.filter(state=Pod.State.BOOTING)).values_list("pk", flat=True))
    if lost:
        Pod.objects.filter(pk__in=lost).update(**leases.queued())
        log.warning("pool %s: sending again %d boots whose tasks were lost", pool.key, len(lost))
        enqueue_boots(lost)
    return lost
