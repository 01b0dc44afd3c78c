"""Make the database and the provider agree: adopt orphans, terminate strays, end lost pods."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from django.conf import settings
from django.db import transaction

from fleetadmin.deployment import pod_prefix
from fleetadmin.hosts import hosts_silent, is_this_host
from pods.models import Pod
from pods.providers import get_provider
from pods.providers.base import Provider, ProviderPod
from pods.services import passes
from pods.services.autostop import autostopped_if_expired
from pods.services.boot import save_created, staged
from pods.services.lifecycle import pod_end, terminate_quietly
from pods.services.preemption import PREEMPTED, pod_vanished, preempted_if_stopped

log = logging.getLogger(__name__)


@dataclass
class ReconcileResult:
    provider: str
    adopted: list[str] = field(default_factory=list)
    terminated: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)
    preempted: list[str] = field(default_factory=list)
    autostopped: list[str] = field(default_factory=list)  # stopped themselves while no control plane ran
    stopped: list[str] = field(default_factory=list)  # stopped by the provider, not preempted (image, host, balance)


def reconcile(*, provider_name: str) -> ReconcileResult:
    """Make the database and the provider agree.

    - a pod at the provider that the database does not know, older than the grace period:
      terminated (without its row, its token is unknown: it could never take a page);
    - a pod whose boot died between its create and saving it: adopted into its own row (and token);
    - a pod the database has that the provider has stopped, or no longer has, after nobody here
      spoke to it for its pool's autostop interval: it stopped itself, its end (not a failure);
    - a pod the database has but the provider no longer has: lost, its pages wait again;
    - a pod the database ended that still runs: terminated again;
    - another host's local pods are that host's to compare (only it sees their processes): left
      alone while it reports, lost once it has been silent for HOST_LOST_AFTER_SECONDS.

    The provider's pods it compares are those named with this deployment's prefix, and those the
    database has whatever their prefix (named before the prefix changed: an upgrade, a renewal).
    """
    provider = get_provider(provider_name)
    result = ReconcileResult(provider_name)
    everyones = Pod.objects.filter(pool__provider=provider_name).select_related("pool")
    _lose_pods_of_silent_hosts(everyones.alive().exclude(host__in=("", settings.HOST_ID)), result)
    known, remote = _known_and_listed(provider, everyones.reachable_here())
    for provider_id, seen in remote.items():
        pod = known.get(provider_id)
        if pod is not None:
            _compare_known(provider, pod, seen, result)
        else:
            _compare_unknown(provider, seen, everyones, result)
    for provider_id, pod in known.items():
        if pod.is_alive and provider_id not in remote:
            _compare_unlisted(provider, pod, result)
    if result.adopted:
        transaction.on_commit(passes.pass_request)  # their boots go on from waiting until they run
    if result.adopted or result.terminated or result.lost or result.preempted or result.stopped or result.autostopped:
        log.warning("reconcile %s: %s", provider_name, result)
    return result


def _known_and_listed(provider: Provider, pods) -> tuple[dict[str, Pod], dict[str, ProviderPod]]:
    """({provider id: our pod}, {provider id: the provider's pod}) of the pods this host compares:
    the provider's named with this deployment's prefix or known to the database."""
    # The database first, then the provider: a pod a boot creates and saves meanwhile is then
    # listed and unknown (young: left to its boot), never known and unlisted (lost: it was ended).
    known = {p.provider_id: p for p in pods.exclude(provider_id="")}
    mine = f"{pod_prefix()}-"
    unsaved = set(pods.alive().filter(provider_id="").values_list("name", flat=True))  # created, not saved yet
    listed = provider.list(prefix="")
    remote = {
        p.provider_id: p for p in listed if p.name.startswith(mine) or p.provider_id in known or p.name in unsaved
    }
    return known, remote


def _compare_known(provider: Provider, pod: Pod, seen: ProviderPod, result: ReconcileResult) -> None:
    """A pod both sides have: terminated again if ended here; ended here if it stopped there."""
    if not pod.is_alive:
        terminate_quietly(provider, pod)
        result.terminated.append(seen.name)
    elif seen.stopped and autostopped_if_expired(pod):  # its end, not a failure
        result.autostopped.append(seen.name)
    elif ended := preempted_if_stopped(pod, seen):  # ended here; the next pass terminates it there
        (result.preempted if ended == PREEMPTED else result.stopped).append(seen.name)


def _compare_unknown(provider: Provider, seen: ProviderPod, everyones, result: ReconcileResult) -> None:
    """A pod the provider has and no row of ours names by its id: adopted if its boot died between
    create and save, terminated if no row of ours is its own, left alone if young or another host's."""
    if seen.age_seconds < settings.RECONCILE_GRACE_SECONDS:
        return  # its create may be saving right now
    row = everyones.filter(name=seen.name).first()
    if row is not None and not is_this_host(row.host):
        return  # another host's local pod (hosts that share a machine see each other's processes)
    if row is not None and row.is_alive and not row.provider_id:
        save_created(row, seen, None)  # the boot died between create and save
        Pod.objects.filter(pk=row.pk, state=Pod.State.BOOTING).update(**staged(Pod.BootStage.RUNNING))
        result.adopted.append(seen.name)
        return
    # A pod with no row of ours: its token (in its environment, never shown) is unknown, so
    # no request of ours would ever be accepted by it. Terminated, never adopted.
    provider.terminate(seen.provider_id)
    result.terminated.append(seen.name)


def _compare_unlisted(provider: Provider, pod: Pod, result: ReconcileResult) -> None:
    """A pod alive here that the provider did not list: stopped itself, stopped there, or gone."""
    if autostopped_if_expired(pod):  # a local pod that stopped itself is gone from the process table
        result.autostopped.append(pod.name)
        return
    # Not listed is not gone: RunPod's listing lags a create (and an outbid on the TERMINATED
    # path leaves it at once). The pod's own query says which (review rows 5 and 16).
    seen = provider.get(pod.provider_id)
    if seen is not None:
        if ended := preempted_if_stopped(pod, seen):
            (result.preempted if ended == PREEMPTED else result.stopped).append(pod.name)
        return
    pod_vanished(pod)
    (result.preempted if pod.interruptible else result.lost).append(pod.name)


def _lose_pods_of_silent_hosts(others, result: ReconcileResult) -> None:
    """Other hosts' alive local pods: lost (their pages wait again) once their host is silent."""
    by_host: dict[str, list[Pod]] = {}
    for pod in others:
        by_host.setdefault(pod.host, []).append(pod)
    for host in hosts_silent(set(by_host)):
        for pod in by_host[host]:
            error = f"its host {host} stopped reporting for {settings.HOST_LOST_AFTER_SECONDS:g} s"
            pod_end(pod=pod, state=Pod.State.LOST, error=error)
            result.lost.append(pod.name)
