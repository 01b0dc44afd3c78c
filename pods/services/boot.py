"""Booting a pod, one short step at a time: create it on the cheapest candidate with capacity,
wait until it runs with its port exposed, wait until its model answers, join it.

A boot is a row: a pod in state BOOTING, its ``boot_stage``, when it entered it
(``stage_started_at``) and when a pass next looks at it (``step_at``). Passes
(pods/services/passes.py) advance every due boot by one step: one provider call or one
health check of the pod, bounded in time; a step never sleeps and never waits in a loop,
so no worker is held while a pod comes up (invariant 15). The stages:

- ``create``: walk the pool's candidates cheapest first, at most one create call a step;
- ``creating``: a create call is out. Written (and committed) before the call, so a step
  that finds a pod here found one whose step died mid-create: it lists the provider's
  pods by the boot's name and adopts the one it finds, else walks again. One pod per boot;
- ``running``: created; wait until the provider runs it with its port exposed;
- ``model``: wait until its model answers, then join (unless a release or a shed came first).

Steps block (provider calls, HTTP to pods): they run on a pass's threads in django-q2
workers, never in the front's request path.

Length: one state machine, its stages side by side; what interruptible pods add (their floor,
a preemption seen while booting) is a call each into pods/services/preemption.py.
"""

from __future__ import annotations

import logging
import random
import time
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from fleetadmin import leases
from pods import capacity, hooks, planning
from pods.models import Alert, BootAttempt, Pod, Pool
from pods.podclient import pod_engine_answer, reported_lanes
from pods.poolconfig import PoolConfigError, RunPodPoolConfig, local_pod_env, pool_offers
from pods.providers import get_provider
from pods.providers.base import (
    AuthFailed,
    BadRequest,
    Balance,
    NoCapacity,
    Offer,
    PodOptions,
    PodSpec,
    Provider,
    ProviderError,
    ProviderPod,
    Transient,
    UnknownOffer,
)
from pods.services.autostop import autostopped_if_expired, pod_contacted
from pods.services.lifecycle import pod_end, pod_terminate_later
from pods.services.preemption import on_demand_floor_unmet, pod_vanished, preempted_if_stopped

log = logging.getLogger(__name__)

Stage = Pod.BootStage

UNKNOWN_OFFER_BLOCK_SECONDS = 3600.0
# A step holds its pod's lease this long: longer than any one step can take (a RunPod call,
# its tries and waits, is at most RUNPOD_CALL_SECONDS, 90 s), so that no second step ever runs
# beside a create call still out. A step whose worker died leaves it; the pod is due again once
# it lapses.
BOOT_STEP_LEASE_SECONDS = float(capacity.PROBE_LOCK_SECONDS)
# Every candidate left is being probed by other boots: look again this soon.
PROBED_ELSEWHERE_SECONDS = 0.2
# While its model loads, one step in this many asks the provider whether the pod still
# exists; the others ask the pod whether its model answers.
PROVIDER_CHECK_POLLS = 5
LOCAL_POD_POLL_SECONDS = 0.25  # a booting local pod's polls: cheap, in a new user's first job (issue 27)
# A read the provider could not answer now (429, 5xx, a network fault) is asked again after a
# back-off that doubles from the poll interval with each step of the stage so far, up to this, with
# full jitter, and never sooner than a Retry-After: it never ends a boot (review row 13). The
# stage's own time limit still does.
TRANSIENT_BACKOFF_MAX_SECONDS = 60.0
POLLS_AT_FULL_RATE = 10  # a cloud pod's polls in a stage before they spread out (_poll_seconds)


class BootFailed(Exception):
    pass


class BootCancelled(BootFailed):
    """A shed asked this anticipatory boot to stop before it joins, or the pod was released."""


# --- the pass's side: which boots are due, one step of one ---------------------------------------


def boots_due(*, now: datetime, limit: int) -> list[int]:
    """Booting pods whose next step is due and whose lease no step holds, longest waiting first."""
    due = Pod.objects.filter(state=Pod.State.BOOTING, step_at__lte=now).reachable_here()
    return list(leases.free(due, now=now).order_by("step_at").values_list("pk", flat=True)[:limit])


def boot_step(pod_id: int) -> None:
    """Advance one booting pod by one step, under its lease (a second pass, on this host or
    another, leaves it alone). A failure ends the boot: the pod is ended and terminated."""
    row = Pod.objects.filter(pk=pod_id, state=Pod.State.BOOTING)
    token = leases.acquire(row, seconds=BOOT_STEP_LEASE_SECONDS)
    if token is None:
        return  # joined or ended meanwhile, or another step holds it
    try:
        pod = Pod.objects.select_related("pool").get(pk=pod_id)
        _step(pod, token)
    except leases.LeaseLost:
        log.warning("pod %s: another step took over its boot", pod_id)
    except Exception:
        _next_step(pod_id, in_seconds=settings.POD_POLL_SECONDS)  # tried again at a bounded rate
        raise
    finally:
        leases.release(Pod.objects.filter(pk=pod_id), token)


def _step(pod: Pod, token: str) -> None:
    provider = get_provider(pod.pool.provider)
    # Pods staged before boots were steps (or by hand) carry no stage: as the migration stages them.
    stage = pod.boot_stage or (Stage.RUNNING if pod.provider_id else Stage.CREATING)
    try:
        if pod.cancel_requested_at is not None:
            raise BootCancelled("cancelled by a shed before it joined")
        if pod.state != Pod.State.BOOTING:
            raise BootCancelled(f"released while booting ({pod.state})")
        STEPS[stage](pod, provider, token)
    except Transient as exc:
        if _stage_past_deadline(pod, stage):
            _boot_end(pod, provider, BootFailed(f"the provider kept failing past the stage's time limit: {exc}"))
        else:
            _transient_later(pod, exc)
    except (BootFailed, ProviderError, PoolConfigError) as exc:
        _boot_end(pod, provider, exc)


def _stage_past_deadline(pod: Pod, stage: str) -> bool:
    """Whether the stage's own time limit has passed (a transient read is asked again until then)."""
    if stage == Stage.RUNNING:
        return _past(pod.billed_from or pod.created_at, settings.POD_RUNNING_TIMEOUT_SECONDS)
    if stage == Stage.MODEL:
        return _past(pod.stage_started_at, settings.POD_READY_TIMEOUT_SECONDS)
    return _past(pod.stage_started_at or pod.created_at, settings.POD_CREATE_TIMEOUT_SECONDS)


def transient_backoff(polls_in_a_row: int, *, poll: float, retry_after: float | None) -> float:
    """Seconds before a read that failed transiently is asked again: full jitter over a doubling
    interval (AWS's "exponential backoff and jitter"), capped, and never under ``retry_after``."""
    ceiling = min(TRANSIENT_BACKOFF_MAX_SECONDS, poll * 2 ** min(polls_in_a_row, 16))
    return max(random.uniform(poll, max(poll, ceiling)), retry_after or 0.0)


def _transient_later(pod: Pod, exc: Transient) -> None:
    log.warning("boot of %s: the provider failed a read (%s); asking again later", pod.name, exc)
    delay = transient_backoff(pod.stage_steps, poll=_poll_seconds(pod), retry_after=exc.retry_after)
    _next_step(pod.pk, in_seconds=delay)


def _boot_end(pod: Pod, provider: Provider, exc: Exception) -> None:
    """The boot failed or was cancelled: the pod ends here and at the provider."""
    log.warning("boot of %s failed: %s", pod.name, exc)
    if isinstance(exc, AuthFailed):  # refused before any create, e.g. on the catalogue
        Alert.raise_(pool=pod.pool, kind=Alert.Kind.AUTH, message=f"{provider.name}: {exc}")
    pod.refresh_from_db()
    if pod.is_alive:
        # Ended here; the next pass terminates it at the provider (tried until confirmed).
        cancelled = isinstance(exc, BootCancelled)
        pod_end(pod=pod, state=Pod.State.TERMINATED if cancelled else Pod.State.FAILED, error=str(exc))
    else:
        pod_terminate_later(pod=pod)  # ended while this step ran, e.g. released while its create call was out


def staged(stage: str) -> dict:
    """Field values of a booting pod entering ``stage``, its first step due now (a pass is asked
    for by whoever writes them, once committed: ``passes.pass_request``)."""
    now = timezone.now()
    return {"boot_stage": stage, "stage_started_at": now, "stage_steps": 0, "step_at": now}


def _enter(pod: Pod, stage: str, **fields) -> None:
    """Move the boot to ``stage``, its first step due now; BootCancelled if it was released meanwhile."""
    values = staged(stage)
    if not Pod.objects.filter(pk=pod.pk, state=Pod.State.BOOTING).update(**values, **fields):
        raise BootCancelled("released while booting")
    for name, value in {**values, **fields}.items():
        setattr(pod, name, value)


def _next_step(pod_id: int, *, in_seconds: float) -> None:
    Pod.objects.filter(pk=pod_id, state=Pod.State.BOOTING).update(
        step_at=timezone.now() + timedelta(seconds=in_seconds), stage_steps=F("stage_steps") + 1
    )


def _past(started: datetime | None, seconds: float) -> bool:
    return started is not None and timezone.now() > started + timedelta(seconds=seconds)


# --- stage create: one candidate at a time ------------------------------------------------------


def _create_step(pod: Pod, provider: Provider, token: str) -> None:
    """One step of the walk over the pool's candidates, cheapest first. A candidate of unknown
    capacity is probed by one boot at a time; one that gave a pod lately is open, and boots create
    on it side by side, as many at once as its slots (doubling while it gives pods: 64 boots of
    one GPU type are created in 7 rounds, not one a pass; capacity.probe_finish);
    every boot skips it while its "no capacity" verdict lasts. The walk tries each candidate once
    (its create calls so far are its BootAttempt rows)."""
    offers, config = pool_offers(pod.pool)
    catalogue = offers
    if config is not None:
        fetched = capacity.catalogue_get(provider.name, wait=False)
        if fetched is None:  # another boot is fetching the first catalogue right now
            return _walk_later(pod)
        catalogue = fetched.offers
    on_demand = config is not None and (pod.on_demand_only or on_demand_floor_unmet(pod, config.on_demand_floor))
    ranked = planning.candidates(offers, catalogue, provider=provider.name, on_demand=on_demand)
    tried = _tried_in_this_walk(pod)
    failed = (BootAttempt.Outcome.TRANSIENT, BootAttempt.Outcome.REFUSED)
    errors = {key: error for key, (outcome, error) in tried.items() if outcome in failed}
    blocked = capacity.blocked_keys([key for _, key in ranked])
    probed_elsewhere = 0
    busy_price = None  # the cheapest candidate's whose creates other boots have out right now
    for offer, key in planning.to_try(ranked, blocked=blocked, tried=set(tried)):
        if busy_price is not None and offer.cost_per_hr > busy_price and _waits_for_cheaper(pod):
            break  # a dearer one: wait for the cheaper one's creates instead
        how = capacity.probe_acquire(key)
        if how is None:
            probed_elsewhere += 1  # another boot is trying it right now
            busy_price = offer.cost_per_hr if busy_price is None else busy_price
            continue
        return _create_on(pod, provider, token, offer, key, how, config)
    if not probed_elsewhere:
        raise BootFailed(_none_created(len(ranked), errors))
    _walk_later(pod)


def _waits_for_cheaper(pod: Pod) -> bool:
    """``planning.waits_for_cheaper`` from the start of this boot's walk."""
    started = pod.stage_started_at or pod.created_at
    return planning.waits_for_cheaper(started, now=timezone.now(), wait_seconds=settings.BOOT_CHEAPER_WAIT_SECONDS)


def _walk_later(pod: Pod) -> None:
    if _past(pod.stage_started_at or pod.created_at, settings.POD_CREATE_TIMEOUT_SECONDS):
        raise BootFailed(f"no candidate free after {settings.POD_CREATE_TIMEOUT_SECONDS:.0f} s")
    _next_step(pod.pk, in_seconds=PROBED_ELSEWHERE_SECONDS)


def _create_on(
    pod: Pod, provider: Provider, token: str, offer: Offer, key: str, how: str, config: RunPodPoolConfig | None
) -> None:
    """The one create call of a step, on a candidate whose probe this boot holds (``how`` is
    PROBE) or that a create opened lately (OPEN: boots create on it side by side)."""
    autostop = pod.pool.autostop_seconds
    spec = PodSpec(
        name=pod.name,
        lanes=pod.lanes,
        offer=offer,
        image=config.image if config else "",
        ports=config.ports if config else "",
        # The pod's token goes in its environment, never on a command line.
        env={
            **(config.env if config else local_pod_env(pod.pool)),
            **({"POD_TOKEN": pod.token} if pod.token else {}),
            # It stops itself once the control plane is silent this long (pods/services/autostop.py).
            "AUTOSTOP_SECONDS": str(autostop),
        },
        page_timeout=settings.PAGE_TIMEOUT_SECONDS,
        options=config.pod_options() if config else PodOptions(),
    )
    started = time.monotonic()
    try:
        # Committed before the call: a step that dies inside it leaves "creating", and the next
        # step looks for the pod by its name before it creates anything (a local pod: on this host).
        creating = {"boot_stage": Stage.CREATING, "host": _host_of(pod), "interruptible": offer.interruptible,
                    "autostop_seconds": autostop}  # fmt: skip
        if not Pod.objects.filter(pk=pod.pk, task_lease_token=token).update(**creating):
            raise leases.LeaseLost(pod.name)
        created = provider.create(spec)
        # Still ours? If another step took the boot over, that one adopts this pod by its name.
        leases.renew(Pod.objects.filter(pk=pod.pk), token, seconds=BOOT_STEP_LEASE_SECONDS)
    except (ProviderError, ValueError) as exc:
        # Every refusal the provider sorted, and any it did not (a BadRequest): this candidate
        # gave no pod, the walk goes on (review row 1: an unknown wording failed the boot).
        return _create_refused(pod, provider, key, how, exc, started)
    except BaseException:
        capacity.probe_finish(key, how=how)
        raise
    save_created(pod, created, offer)
    _attempt(pod, key, BootAttempt.Outcome.CREATED, None, started)
    capacity.probe_finish(key, how=how, created=True)
    Alert.resolve(pool=pod.pool, kind=Alert.Kind.AUTH)
    Alert.objects.filter(pool__provider=pod.pool.provider, kind=Alert.Kind.BALANCE, resolved_at__isnull=True).update(
        resolved_at=timezone.now()
    )
    _enter(pod, Stage.RUNNING)


def _create_refused(pod: Pod, provider: Provider, key: str, how: str, exc: Exception, started: float) -> None:
    """The candidate gave no pod. No capacity and an unknown offer block it for every boot;
    a refused key or a value the SDK cannot send end this boot; the rest walk on."""
    pool = pod.pool
    if isinstance(exc, NoCapacity):
        _attempt(pod, key, BootAttempt.Outcome.NO_CAPACITY, exc, started)
        capacity.probe_finish(key, how=how, blocked_for=settings.CAPACITY_VERDICT_TTL_SECONDS, reason=str(exc))
    elif isinstance(exc, UnknownOffer):
        _attempt(pod, key, BootAttempt.Outcome.UNKNOWN_OFFER, exc, started)
        capacity.probe_finish(key, how=how, blocked_for=UNKNOWN_OFFER_BLOCK_SECONDS, reason=str(exc))
        Alert.raise_(pool=pool, kind=Alert.Kind.CONFIG, message=f"{key}: {exc}")
    elif isinstance(exc, AuthFailed):
        _attempt(pod, key, BootAttempt.Outcome.AUTH_FAILED, exc, started)
        capacity.probe_finish(key, how=how)
        Alert.raise_(pool=pool, kind=Alert.Kind.AUTH, message=f"{provider.name}: {exc}")
        raise BootFailed(f"the provider refused our credentials: {exc}")
    elif isinstance(exc, Balance):
        _attempt(pod, key, BootAttempt.Outcome.BALANCE, exc, started)
        capacity.probe_finish(key, how=how)
        Alert.raise_(pool=pool, kind=Alert.Kind.BALANCE, message=f"{provider.name}: {exc}")
        raise BootFailed(f"the provider account's balance refused a pod: {exc}")
    elif isinstance(exc, Transient):
        _attempt(pod, key, BootAttempt.Outcome.TRANSIENT, exc, started)
        capacity.probe_finish(key, how=how)
    elif isinstance(exc, BadRequest) or (isinstance(exc, ProviderError) and not isinstance(exc, ValueError)):
        # Refused in words we do not sort: not this boot's end, and not a verdict for other boots.
        _attempt(pod, key, BootAttempt.Outcome.REFUSED, exc, started)
        capacity.probe_finish(key, how=how)
    else:  # a value the SDK cannot send safely
        _attempt(pod, key, BootAttempt.Outcome.INVALID, exc, started)
        capacity.probe_finish(key, how=how)
        Alert.raise_(pool=pool, kind=Alert.Kind.CONFIG, message=str(exc))
        raise BootFailed(str(exc))
    _walk_on(pod)


def _walk_on(pod: Pod) -> None:
    """This candidate gave no pod: the next step tries the next one, on the next pass."""
    Pod.objects.filter(pk=pod.pk, state=Pod.State.BOOTING).update(boot_stage=Stage.CREATE, step_at=timezone.now())


def _tried_in_this_walk(pod: Pod) -> dict[str, tuple[str, str]]:
    """Candidate -> (outcome, error) of the create calls this walk made, oldest first."""
    attempts = pod.boot_attempts.filter(created_at__gte=pod.stage_started_at or pod.created_at)
    return {key: (outcome, error) for key, outcome, error in attempts.order_by("created_at", "pk").values_list(
        "candidate", "outcome", "error")}  # fmt: skip


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
    BootAttempt.record(
        pod=pod, candidate=key, outcome=outcome, error=str(error or "")[:2000], seconds=time.monotonic() - started
    )


def _host_of(pod: Pod) -> str:
    """A local pod created here is this host's (its process, its loopback port); others are anyone's."""
    return settings.HOST_ID if pod.pool.provider == Pool.Provider.LOCAL else ""


def save_created(pod: Pod, created: ProviderPod, offer: Offer | None) -> None:
    pod.provider_id = created.provider_id
    pod.billed_from = pod.billed_from or timezone.now()
    fields = ["provider_id", "billed_from"]
    pod.host = _host_of(pod)
    fields.append("host")
    if offer is not None:
        pod.gpu_type, pod.cloud_type, pod.data_center = offer.gpu_type, offer.cloud_type, offer.data_center
        pod.placed_in = created.data_center  # where it went (the candidate may have named none)
        pod.cost_per_hr = created.cost_per_hr or offer.cost_per_hr  # an interruptible pod's: its bid
        pod.interruptible = offer.interruptible
        fields += ["gpu_type", "cloud_type", "data_center", "placed_in", "cost_per_hr", "interruptible"]
    pod.save(update_fields=fields)


# --- stage creating: a step died with its create call out ---------------------------------------


def _creating_step(pod: Pod, provider: Provider, token: str) -> None:
    if _adopt_by_name(pod, provider):
        _enter(pod, Stage.RUNNING)
    else:
        _enter(pod, Stage.CREATE)  # the call never reached the provider: a new walk, its own time limit


def _adopt_by_name(pod: Pod, provider: Provider) -> bool:
    """A step that died after its create but before saving left a pod under this name."""
    for found in provider.list(prefix=pod.name):
        if found.name == pod.name:
            save_created(pod, found, None)
            log.warning("boot of %s: adopted %s, created by an earlier step", pod.name, found.provider_id)
            return True
    return False


# --- stages running and model: one look a step --------------------------------------------------


def _running_step(pod: Pod, provider: Provider, token: str) -> None:
    seen = provider.get(pod.provider_id)
    if (seen is None or seen.stopped) and autostopped_if_expired(pod):
        return  # it stopped itself while no control plane spoke to it: its end, not a failure
    if seen is None:
        if pod.interruptible:
            return pod_vanished(pod)  # possibly preempted (an outbid on the TERMINATED path)
        raise BootFailed("the pod went away while booting")
    if preempted_if_stopped(pod, seen):
        return
    if seen.running and seen.base_url:
        return _enter(pod, Stage.MODEL, base_url=seen.base_url)
    if _past(pod.billed_from or pod.created_at, settings.POD_RUNNING_TIMEOUT_SECONDS):
        raise BootFailed(f"not running after {settings.POD_RUNNING_TIMEOUT_SECONDS:.0f} s")
    _next_step(pod.pk, in_seconds=_poll_seconds(pod))


def _model_step(pod: Pod, provider: Provider, token: str) -> None:
    if _asks_the_provider(pod):
        seen = provider.get(pod.provider_id)
        if (seen is None or seen.stopped) and autostopped_if_expired(pod):
            return
        if seen is None and pod.interruptible:
            return pod_vanished(pod)
        if seen is None:
            raise BootFailed("the pod went away while loading its model")
        if preempted_if_stopped(pod, seen):
            return
    else:
        answered, engine = pod_engine_answer(pod.base_url, token=pod.token)
        if answered:
            pod_contacted(pod=pod)  # it heard us, with its token: its autostop counts from here
        if engine is not None:
            return _join(pod, provider, engine)
    if _past(pod.stage_started_at, settings.POD_READY_TIMEOUT_SECONDS):
        raise BootFailed(f"its model was not ready {settings.POD_READY_TIMEOUT_SECONDS:.0f} s after it ran")
    _next_step(pod.pk, in_seconds=_poll_seconds(pod))


def _poll_seconds(pod: Pod) -> float:
    """A booting pod's next poll: a local pod's at once-ish; a cloud pod's every POD_POLL_SECONDS for
    the stage's first POLLS_AT_FULL_RATE steps, then twice as far apart each as many steps more, up
    to POD_POLL_MAX_SECONDS: an image that pulls for minutes is not asked about every second (64
    boots at 1 s are 64 calls a second, which RunPod answers with 429s; review row 13)."""
    if pod.pool.provider == "local":
        return min(settings.POD_POLL_SECONDS, LOCAL_POD_POLL_SECONDS)
    doublings = min(pod.stage_steps // POLLS_AT_FULL_RATE, 16)
    return max(settings.POD_POLL_SECONDS, min(settings.POD_POLL_SECONDS * 2**doublings, settings.POD_POLL_MAX_SECONDS))


def _asks_the_provider(pod: Pod) -> bool:
    """Whether this model-stage step asks the provider instead of the pod: one step in each
    PROVIDER_CHECK_POLLS, counted in steps (never the first). Counted in steps, not in windows of
    time: steps further apart than a window (a long pass, a loaded machine) would each open a new
    window, ask the provider every time and never the pod, and the boot would never join."""
    return pod.stage_steps > 0 and pod.stage_steps % PROVIDER_CHECK_POLLS == 0


def _join(pod: Pod, provider: Provider, engine: dict) -> None:
    with transaction.atomic():
        # A release or a shed may have been asked since this step began: then we do not join.
        current = Pod.objects.select_for_update().get(pk=pod.pk)
        if current.state != Pod.State.BOOTING or current.cancel_requested_at is not None:
            if current.is_alive:  # a released pod was ended, and marked for a terminate, then
                pod_end(pod=current, state=Pod.State.TERMINATED, error="cancelled by a shed before it joined")
            return
        pod.engine, pod.boot_stage, pod.step_at = engine, "", None
        pod.lanes = reported_lanes(engine, default=pod.lanes)
        pod.save(update_fields=["engine", "boot_stage", "step_at", "lanes"])
        pod.mark_ready(base_url=pod.base_url)
    log.info("pod %s ready at %s", pod.name, pod.base_url)
    hooks.jobs().pod_ready(pod=pod)


STEPS = {
    Stage.CREATE: _create_step,
    Stage.CREATING: _creating_step,
    Stage.RUNNING: _running_step,
    Stage.MODEL: _model_step,
}
