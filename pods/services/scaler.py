"""The scaler: a pool's demand for pods, and the tick that boots what is needed and sheds the rest."""

from __future__ import annotations

import logging
import math
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from ocrjobs import selectors
from ocrjobs.selectors.budgets import jobs_past_owners_day
from pods import capacity
from pods.models import Alert, Pod, Pool, pod_name
from pods.poolconfig import PoolConfigError, pool_offers
from pods.providers.base import ProviderError
from pods.services import passes
from pods.services.boot import staged
from pods.services.lifecycle import pod_release
from pods.services.preemption import fleet_before_preemption, preemption_rate, redo_seconds
from pods.services.reconcile import reconcile
from pods.spend import jobs_spend

log = logging.getLogger(__name__)

# A pool gets a shed tick of its own when it is due within this long; later sheds are the schedule's.
SHED_TICK_HORIZON_SECONDS = 90.0
SHED_TICK_MARGIN_SECONDS = 0.5


@dataclass
class Demand:
    waiting: int  # pages waiting, from the database (each page once, however often it was tried)
    running: int
    seconds_per_page: float
    wanted: int  # pods, between the warm floor and max pods
    capped_jobs: list[int] = field(default_factory=list)
    affordable: int | None = None  # pods whose boots and idle tails the work pays for (None: no cap)
    sized_for: str = "balanced"  # what set `wanted`: balanced, fastest, cheapest, or "deadline of job N"
    missed_deadline: str = ""  # a deadline that max pods cannot meet, and the earliest it could be met
    per_page_guessed: bool = False  # no page measured yet: seconds_per_page is the setting's guess
    on_demand_only: bool = False  # a deadline interruptible pods would put at risk: boots rent on demand


def seconds_per_page(pool: Pool) -> float:
    """Measured: the mean time of the pool's last pages on their pods; a setting until there are some."""
    return _seconds_per_page(pool)[0]


def _seconds_per_page(pool: Pool) -> tuple[float, bool]:
    """(seconds per page, whether that is the setting's guess because no page was measured yet)."""
    mean = selectors.pool_seconds_per_page(pool.pk)
    return (float(mean), False) if mean else (settings.SCALE_SECONDS_PER_PAGE_GUESS, True)


def boot_times(pool: Pool) -> list[float]:
    """Seconds from create to ready of the pool's last 20 boots (none before the first)."""
    # By pool_id, not pool.pods: the related manager reads each pod's pool_id, left out by only(),
    # with a query of its own (8 pods: 8 more queries for every submission's forecast).
    recent = Pod.objects.filter(pool_id=pool.pk, ready_at__isnull=False).order_by("-ready_at")[:20]
    return [(p.ready_at - (p.billed_from or p.created_at)).total_seconds() for p in recent.only(
        "ready_at", "billed_from", "created_at")]  # fmt: skip


def boot_seconds(pool: Pool, times: list[float] | None = None) -> float:
    """Measured: the mean time from create to ready of the pool's last boots; a setting until there are some."""
    times = boot_times(pool) if times is None else times
    return sum(times) / len(times) if times else settings.SCALE_BOOT_SECONDS_GUESS


def _jobs_over_budget(pool: Pool) -> list[int]:
    """Jobs with pages waiting in the pool that have spent their own budget, or whose owner's jobs
    together have spent the owner's day."""
    budgets = selectors.budgeted_jobs_waiting(pool.pk)
    spent = jobs_spend(job_id for job_id, _ in budgets)
    over = {job_id for job_id, max_dollars in budgets if spent[job_id] >= max_dollars}
    return sorted(over.union(jobs_past_owners_day(pool.pk)))


def pool_floor(pool: Pool) -> int:
    """Pods the pool keeps even without work: its min pods, and for a local pool at least
    LOCAL_WARM_PODS (what ``manage.py up`` keeps warm); never above max pods."""
    warm = settings.LOCAL_WARM_PODS if pool.provider == Pool.Provider.LOCAL else 0
    return min(max(pool.min_pods, warm), pool.max_pods)


def pool_demand(pool: Pool) -> Demand:
    """Pods wanted: the work waiting (pages × measured seconds per page), spread over the
    lanes of a pod, drained within SCALE_TARGET_SECONDS; but no more pods than the work
    pays for (each costs its boot and its idle tail, which may add SCALE_MAX_OVERHEAD of
    the work at most); between the floor and max pods. Pages of jobs past their budget
    want no pod."""
    capped = _jobs_over_budget(pool)
    backlog = selectors.pool_backlog(pool.pk, exclude_jobs=capped)
    waiting, running = backlog.waiting, backlog.running
    per_page, guessed = _seconds_per_page(pool)
    work = (waiting + running) * per_page * preemption_overhead(pool, per_page)  # lane-seconds
    wanted = math.ceil(work / (pool.lanes_per_pod * settings.SCALE_TARGET_SECONDS)) if work else 0
    affordable = None
    fixed = boot_seconds(pool) + pool.idle_seconds  # pod-seconds each pod costs beyond its pages
    if settings.SCALE_MAX_OVERHEAD and fixed > 0:
        affordable = math.floor(settings.SCALE_MAX_OVERHEAD * work / pool.lanes_per_pod / fixed)
        wanted = min(wanted, affordable)
    if waiting and not wanted:
        wanted = 1
    if waiting:  # a preempted pod is replaced, not forgone; but never more pods than the pages fill
        wanted = max(wanted, min(fleet_before_preemption(pool), math.ceil(waiting / pool.lanes_per_pod)))
    sized_for, missed, on_demand_only = "balanced", "", False
    scheduled = selectors.pool_scheduled_jobs(pool.pk, exclude_jobs=capped)
    priorities = {priority for _, deadline, priority in scheduled if deadline is None}
    deadlines = sorted((deadline, job_id) for job_id, deadline, _ in scheduled if deadline is not None)
    planned, planned_work = waiting + running, work
    if deadlines or "fastest" in priorities:
        # What the split has not made rows of yet counts too: it tells the scaler of its first
        # batch only, and a deadline sized on that batch would be missed by the rest.
        unsplit = selectors.pool_pages_not_split(pool.pk, exclude_jobs=capped)
        planned, planned_work = planned + unsplit, work + unsplit * per_page
    if "fastest" in priorities and planned:
        # As many pods as the pages can use at once, the overhead cap aside.
        wanted, sized_for = max(wanted, math.ceil(planned / pool.lanes_per_pod)), "fastest"
    elif work and priorities == {"cheapest"} and not deadlines:
        wanted, sized_for = 1, "cheapest"  # one pod: one boot, one idle tail, however long it takes
    if deadlines and planned_work:
        deadline, job_id = deadlines[0]
        needed, earliest = pods_for_deadline(pool, work=planned_work, deadline=deadline)
        if needed > wanted:
            wanted, sized_for = needed, f"deadline of job {job_id}"
        on_demand_only = _deadline_at_risk_from_preemption(pool, planned_work, deadline, wanted, per_page)
        if earliest is not None:
            missed = (
                f"job {job_id}'s deadline {deadline.isoformat()} cannot be met: {planned} pages "
                f"at {per_page:.2f} s each on at most {pool.max_pods} pods of {pool.lanes_per_pod} lanes; "
                f"the earliest it could be met is {earliest.isoformat(timespec='seconds')}"
            )
    wanted = min(max(wanted, pool_floor(pool)), pool.max_pods)
    return Demand(waiting, running, per_page, wanted, capped, affordable, sized_for, missed, guessed, on_demand_only)


def preemption_overhead(pool: Pool, per_page: float) -> float:
    """How much more pod time the work takes for the preemptions measured over the pool's last
    hours: each one costs a replacement's boot and the pages in flight again (1.0: none)."""
    rate = preemption_rate(pool).per_pod_hour
    if not rate:
        return 1.0
    return 1.0 + rate * redo_seconds(seconds_per_page=per_page, boot_seconds=boot_seconds(pool)) / 3600


def _deadline_at_risk_from_preemption(pool: Pool, work: float, deadline: datetime, pods: int, per_page: float) -> bool:
    """Whether the deadline has no room for one preemption on each of the pods it needs (a
    replacement's boot and the pages in flight read again): then the rest of the work goes to
    on-demand pods. Only for pools that rent interruptible pods."""
    try:
        config = pool_offers(pool)[1]
    except PoolConfigError:
        return False
    if config is None or not config.has_interruptible:
        return False
    redo = redo_seconds(seconds_per_page=per_page, boot_seconds=boot_seconds(pool)) * pool.lanes_per_pod
    _, earliest = pods_for_deadline(pool, work=work + max(pods, 1) * redo, deadline=deadline)
    return earliest is not None


def pods_for_deadline(pool: Pool, *, work: float, deadline: datetime) -> tuple[int, datetime | None]:
    """(pods to finish ``work`` lane-seconds by ``deadline``, None) when max pods can; otherwise
    (max pods, the earliest time they could finish it).

    The whole backlog counts (pages are dispatched in the order they came, not by deadline).
    Ready pods work from now; any other pod only after a measured boot."""
    now = timezone.now()
    lanes = pool.lanes_per_pod
    ready_lanes = sum(pool.pods.filter(state=Pod.State.READY).values_list("lanes", flat=True))
    ready = math.ceil(ready_lanes / lanes) if ready_lanes else 0
    boot = boot_seconds(pool)
    left = (deadline - now).total_seconds()
    remaining = work - ready_lanes * max(left, 0)
    if remaining <= 0:
        return max(ready, 1 if work else 0), None
    if left > boot:
        needed = ready + math.ceil(remaining / (lanes * (left - boot)))
        if needed <= pool.max_pods:
            return needed, None
    # The earliest t at which ready lanes over t, and every other pod allowed over (t - boot), do the work.
    extra_lanes = max(pool.max_pods - ready, 0) * lanes
    if ready_lanes and ready_lanes * boot >= work:
        seconds = work / ready_lanes
    elif ready_lanes + extra_lanes:
        seconds = (work + extra_lanes * boot) / (ready_lanes + extra_lanes)
    else:
        return pool.max_pods, now + timezone.timedelta(days=365)
    return pool.max_pods, now + timezone.timedelta(seconds=seconds)


def dispatch_stalled(pool: Pool, demand: Demand) -> str:
    """Why dispatch looks stalled (pages waiting, lanes free, nothing started for a while), or ""."""
    if not demand.waiting:
        return ""
    quiet = timezone.now() - timezone.timedelta(seconds=settings.STALL_SECONDS)
    ready = pool.pods.filter(state=Pod.State.READY)
    lanes = sum(ready.filter(ready_at__lt=quiet).values_list("lanes", flat=True))
    free = lanes - demand.running
    if free <= 0:
        return ""
    last_start = selectors.pool_last_start(pool.pk)
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
    raised instead). A shed stops boots first: anticipatory ones (warm floor,
    scale requests), then those booted for pages that are gone (done, or their
    job cancelled); never a boot that waiting pages need. Then it releases idle
    ready pods above the floor (``force_shed``: idle or not, but never one
    with a page running).
    """
    # function-level: pods writes through an ocrjobs service; ocrjobs imports pods at module level
    from ocrjobs.services.dispatchers import dispatch_ensure
    from ocrjobs.services.escalation_budget import pages_escalated_over_budget

    pool.refresh_from_db()
    demand = pool_demand(pool)
    # Escalated pages of jobs past their budget boot nothing here: they keep their first reading.
    pages_escalated_over_budget(pool_id=pool.pk, job_ids=demand.capped_jobs)
    booted: list[int] = []
    shed: list[int] = []
    cancelled = 0
    blocked = ""
    with transaction.atomic():
        Pool.objects.select_for_update().filter(pk=pool.pk).first()  # one tick per pool at a time
        serving = list(pool.pods.filter(state__in=[Pod.State.BOOTING, Pod.State.READY], cancel_requested_at=None))
        booting = [p for p in serving if p.state == Pod.State.BOOTING]
        to_boot = min(demand.wanted - len(serving), pool.max_parallel_boots - len(booting))
        if demand.per_page_guessed and len(booting) < len(serving):
            # A fleet sized on the guessed page time is wrong by however far the guess is (in
            # bench/storm.py, 6 pods where 1 did the work): the ready pods measure a page within seconds,
            # so wait for it. A pool with no ready pod boots on the guess, or nothing would start;
            # the warm floor (a scale request's target) is not a guess and is still booted to.
            to_boot = min(to_boot, pool_floor(pool) - len(serving))
        if demand.missed_deadline:
            Alert.raise_(pool=pool, kind=Alert.Kind.DEADLINE, message=demand.missed_deadline)
        else:
            Alert.resolve(pool=pool, kind=Alert.Kind.DEADLINE)
        stalled = dispatch_stalled(pool, demand)
        if stalled:
            # More pods would not help a dispatch that does not start pages: say so instead.
            Alert.raise_(pool=pool, kind=Alert.Kind.STALL, message=stalled)
        else:
            Alert.resolve(pool=pool, kind=Alert.Kind.STALL)
        if to_boot > 0:
            blocked = stalled or _auth_blocked(pool) or _balance_blocked(pool) or _budget_blocks(pool)
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
                on_demand_only=demand.on_demand_only,
                **staged(Pod.BootStage.CREATE),
            )
            booted.append(pod.pk)
        if booted:
            transaction.on_commit(passes.pass_request)  # the boots' first steps are due now
        surplus = len(serving) - demand.wanted
        if surplus > 0:
            # Boots first, anticipatory ones before those booted for pages that are gone since (done,
            # or their job cancelled), newest first: they have cost the least so far. Demand counts
            # every page waiting, so a boot that waiting pages need is never part of the surplus.
            newest_first = sorted(booting, key=lambda p: p.created_at, reverse=True)
            for pod in sorted(newest_first, key=lambda p: p.reason == Pod.Reason.DEMAND)[:surplus]:
                Pod.objects.filter(pk=pod.pk).update(cancel_requested_at=timezone.now())
                cancelled += 1
                surplus -= 1
    drained = pool.pods.filter(state=Pod.State.DRAINING).exclude(pk__in=selectors.pods_with_pages_running(pool.pk))
    for pod in drained:
        pod_release(pod=pod, reason="drained")
        shed.append(pod.pk)
    if surplus > 0:
        idle_since = timezone.now() - timezone.timedelta(seconds=pool.idle_seconds)
        busy = selectors.pods_with_pages_running(pool.pk)
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
        log.info("pool %s shed: stopped %d boots no page needs, released %d pods", pool.key, cancelled, len(shed))
    waiting = selectors.pages_waiting(pool_id=pool.pk)
    if waiting and pool.pods.filter(state=Pod.State.READY).exists():
        dispatch_ensure(pool=pool)  # also replaces a dispatcher that died: a stall may be just that
    return TickResult(pool.key, waiting, demand.wanted, len(serving), booted, shed, cancelled, blocked)


def _tick_when_sheddable(pool: Pool, at) -> None:
    """Have a pass tick the pool at ``at``, when a surplus pod will have idled long enough, if that
    is sooner than the schedule would come (one such tick per pool, the earliest wins). Only a
    due time on the pool's row: nothing waits for it (``shed_ticks_due`` finds it)."""
    now = timezone.now()
    if (at - now).total_seconds() > SHED_TICK_HORIZON_SECONDS:
        return  # the schedule comes before then
    at = max(at, now) + timezone.timedelta(seconds=SHED_TICK_MARGIN_SECONDS)
    due = Q(shed_tick_at__isnull=True) | Q(shed_tick_at__lt=now) | Q(shed_tick_at__gt=at)
    Pool.objects.filter(pk=pool.pk).filter(due).update(shed_tick_at=at)


def shed_ticks_due(*, now: datetime, limit: int) -> list[int]:
    """Pools whose shed tick is due, earliest first."""
    due = Pool.objects.filter(shed_tick_at__lte=now).order_by("shed_tick_at")
    return list(due.values_list("pk", flat=True)[:limit])


def shed_tick_step(pool_id: int) -> bool:
    """The pool's shed tick, once: its due time is cleared (by whichever pass gets there first),
    then the provider is reconciled and the pool ticked, as the schedule's tick does. False if
    it was not due (or another pass took it)."""
    pool = Pool.objects.filter(pk=pool_id).first()
    at = pool.shed_tick_at if pool else None
    if at is None or at > timezone.now():
        return False
    if not Pool.objects.filter(pk=pool_id, shed_tick_at=at).update(shed_tick_at=None):
        return False
    try:
        reconcile(provider_name=pool.provider)
    except ProviderError as exc:
        log.warning("reconcile %s failed: %s; ticking on what the database knows", pool.provider, exc)
    pool_tick(pool=pool)
    return True


def _balance_blocked(pool: Pool) -> str:
    """The provider account's balance or spending limit refused a pod lately: no pool of that provider
    boots until BALANCE_RETRY_SECONDS after the last refusal; then one boot may try (a pod it gets
    resolves the alert)."""
    recent = timezone.now() - timezone.timedelta(seconds=settings.BALANCE_RETRY_SECONDS)
    refused = Alert.objects.filter(
        pool__provider=pool.provider, kind=Alert.Kind.BALANCE, resolved_at__isnull=True, updated_at__gte=recent
    ).exists()
    return "the provider account's balance or spending limit refused a pod (see alerts)" if refused else ""


def _auth_blocked(pool: Pool) -> str:
    recent = timezone.now() - timezone.timedelta(seconds=settings.AUTH_RETRY_SECONDS)
    refused = Alert.objects.filter(
        pool__provider=pool.provider, kind=Alert.Kind.AUTH, resolved_at__isnull=True, updated_at__gte=recent
    ).exists()
    return "the provider refused our credentials (see alerts)" if refused else ""
