"""Actions on pools and pods: boot, release, check, and the scaler tick.

Everything here blocks (provider calls, HTTP to pods): it runs in django-q2
workers, never in the front's request path.
"""

from __future__ import annotations

import logging
import math
import time
import uuid
from dataclasses import dataclass

import httpx
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from pods.models import Pod, Pool, pod_name
from pods.providers import get_provider
from pods.providers.base import PodSpec, ProviderError
from pods.providers.local import LOCAL_OFFER

log = logging.getLogger(__name__)


def pod_is_serving(base_url: str, *, timeout: float = 2.0) -> bool:
    """The pod server answers /healthz and says its engine is ready."""
    try:
        with httpx.Client(timeout=timeout) as client:
            if client.get(f"{base_url}/healthz").status_code != 200:
                return False
            return bool(client.get(f"{base_url}/v1/models").json().get("ready"))
    except (httpx.HTTPError, ValueError):
        return False


def pod_boot(*, pod_id: int) -> Pod:
    """Create the pod at its provider, wait until it serves, and join it to the fleet.

    Safe to run again for the same pod (a worker killed mid-boot is retried):
    a pod already created is waited for, not created twice.
    """
    pod = Pod.objects.select_related("pool").get(pk=pod_id)
    if pod.state != Pod.State.BOOTING:
        return pod
    provider = get_provider(pod.pool.provider)
    deadline = time.monotonic() + settings.POD_BOOT_TIMEOUT_SECONDS
    try:
        if not pod.provider_id:
            spec = PodSpec(
                name=pod.name,
                lanes=pod.lanes,
                offer=LOCAL_OFFER,
                page_timeout=settings.PAGE_TIMEOUT_SECONDS,
            )
            created = provider.create(spec)
            pod.provider_id = created.provider_id
            pod.gpu_type = spec.offer.gpu_type
            pod.cloud_type = spec.offer.cloud_type
            pod.data_center = spec.offer.data_center
            pod.cost_per_hr = spec.offer.cost_per_hr
            pod.save(update_fields=["provider_id", "gpu_type", "cloud_type", "data_center", "cost_per_hr"])
        while True:
            seen = provider.get(pod.provider_id)
            if seen is None:
                raise ProviderError("the pod exited while booting")
            if seen.running and seen.base_url and pod_is_serving(seen.base_url):
                break
            if time.monotonic() > deadline:
                raise ProviderError(f"not ready after {settings.POD_BOOT_TIMEOUT_SECONDS:.0f} s")
            time.sleep(0.2)
    except ProviderError as exc:
        log.warning("boot of %s failed: %s", pod.name, exc)
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


def _terminate_quietly(provider, pod: Pod) -> None:
    if not pod.provider_id:
        return
    try:
        provider.terminate(pod.provider_id)
    except ProviderError as exc:
        log.error("terminating %s failed: %s", pod.name, exc)


def pod_release(*, pod: Pod, reason: str) -> Pod:
    """Attribute spend, terminate at the provider, free its pages. Idempotent."""
    if not pod.is_alive:
        return pod
    provider = get_provider(pod.pool.provider)
    if pod.provider_id:
        provider.terminate(pod.provider_id)
    with transaction.atomic():
        pod.mark_ended(Pod.State.TERMINATED, error=f"released: {reason}")
        _requeue_pages_of(pod)
    log.info("pod %s released (%s), spend $%s", pod.name, reason, pod.spend())
    return pod


def _requeue_pages_of(pod: Pod) -> int:
    from ocrjobs.services import pages_requeue_from_pod

    return pages_requeue_from_pod(pod_id=pod.pk)


def pods_check(*, pool: Pool) -> list[Pod]:
    """Mark lost the pods whose process or machine is gone; their pages go back to the queue."""
    provider = get_provider(pool.provider)
    lost = []
    for pod in pool.pods.filter(state__in=[Pod.State.READY, Pod.State.DRAINING]):
        if provider.get(pod.provider_id) is None:
            with transaction.atomic():
                pod.mark_ended(Pod.State.LOST, error="the provider no longer has this pod")
                _requeue_pages_of(pod)
            log.warning("pod %s lost", pod.name)
            lost.append(pod)
    return lost


@dataclass
class TickResult:
    pool: str
    waiting: int
    running: int
    alive: int
    booted: list[int]
    shed: list[int]


def pool_tick(*, pool: Pool) -> TickResult:
    """Compare the pool's backlog with its pods: boot what is needed, shed what idles."""
    from ocrjobs.models import Page

    pods_check(pool=pool)
    pages = Page.objects.filter(pool=pool)
    waiting = pages.waiting().count()
    running = pages.filter(status=Page.Status.RUNNING).count()
    demand = waiting + running
    booted: list[int] = []
    shed: list[int] = []
    with transaction.atomic():
        # Booting pods count as capacity: the next tick must not boot them again.
        serving = list(pool.pods.filter(state__in=[Pod.State.BOOTING, Pod.State.READY]))
        booting = sum(1 for p in serving if p.state == Pod.State.BOOTING)
        if demand:
            wanted = max(pool.min_pods, math.ceil(demand / pool.lanes_per_pod))
        else:
            wanted = pool.min_pods
        wanted = min(wanted, pool.max_pods)
        to_boot = min(wanted - len(serving), pool.max_parallel_boots - booting)
        for _ in range(max(0, to_boot)):
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
        surplus = len(ready) - pool.min_pods
        for pod in ready[: max(0, surplus)]:
            if pod.last_busy_at is None or pod.last_busy_at < idle_since:
                pod_release(pod=pod, reason=f"idle for {pool.idle_seconds} s")
                shed.append(pod.pk)
    if waiting and pool.pods.filter(state=Pod.State.READY).exists():
        from ocrjobs.services import dispatch_ensure

        dispatch_ensure(pool=pool)
    return TickResult(pool.key, waiting, running, len(serving) + len(booted), booted, shed)


def _enqueue_boots(pod_ids: list[int]) -> None:
    from django_q.tasks import async_task

    for pod_id in pod_ids:
        async_task("pods.tasks.boot_pod", pod_id, task_name=f"boot pod {pod_id}", group="boots")
