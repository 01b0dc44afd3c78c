"""The scaler: read a pool into a snapshot, plan its pods (``pods/planning.py``), apply the plan.

The tick boots what the plan wants and sheds the rest; every decision is the plan's."""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass, field, replace
from datetime import datetime
from decimal import Decimal

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from pods import capacity, hooks, planning
from pods.models import Alert, Pod, Pool, pod_name
from pods.poolconfig import PoolConfigError, pool_offers
from pods.providers.base import ProviderError
from pods.services import passes
from pods.services.boot import staged
from pods.services.lifecycle import pod_release
from pods.services.preemption import fleet_before_preemption, preemption_rate
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
    mean = hooks.jobs().pool_seconds_per_page(pool.pk)
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
    budgets = hooks.jobs().budgeted_jobs_waiting(pool.pk)
    spent = jobs_spend(job_id for job_id, _ in budgets)
    over = {job_id for job_id, max_dollars in budgets if spent[job_id] >= max_dollars}
    return sorted(over.union(hooks.jobs().jobs_past_owners_day(pool.pk)))


def pool_floor(pool: Pool) -> int:
    """Pods the pool keeps even without work: its min pods, and for a local pool at least
    LOCAL_WARM_PODS (what ``manage.py up`` keeps warm); never above max pods."""
    warm = settings.LOCAL_WARM_PODS if pool.provider == Pool.Provider.LOCAL else 0
    return min(max(pool.min_pods, warm), pool.max_pods)


def scale_policy(*, force_shed: bool = False) -> planning.Policy:
    """The settings the plan sizes with, for the tick and the forecast alike."""
    return planning.Policy(
        target_seconds=settings.SCALE_TARGET_SECONDS,
        max_overhead=settings.SCALE_MAX_OVERHEAD,
        stall_seconds=settings.STALL_SECONDS,
        force_shed=force_shed,
    )


def pool_shape(pool: Pool) -> dict:
    """The pool's own limits, as ``planning.PoolSnapshot`` takes them."""
    return {
        "lanes_per_pod": pool.lanes_per_pod,
        "max_pods": pool.max_pods,
        "floor": pool_floor(pool),
        "max_parallel_boots": pool.max_parallel_boots,
        "idle_seconds": pool.idle_seconds,
    }


def work_snapshot(pool: Pool) -> tuple[planning.PoolSnapshot, list[int]]:
    """What the pool's work needs, read (the pods come with ``fleet_snapshot``), and the jobs past
    their budget, whose pages are left out of it."""
    capped = _jobs_over_budget(pool)
    backlog = hooks.jobs().pool_backlog(pool.pk, exclude_jobs=capped)
    per_page, guessed = _seconds_per_page(pool)
    jobs = tuple(planning.ScheduledJob(*row) for row in hooks.jobs().pool_scheduled_jobs(pool.pk, exclude_jobs=capped))
    unsplit = hooks.jobs().pool_pages_not_split(pool.pk, exclude_jobs=capped) if planning.needs_unsplit(jobs) else 0
    snapshot = planning.PoolSnapshot(
        now=timezone.now(),
        **pool_shape(pool),
        waiting=backlog.waiting,
        running=backlog.running,
        seconds_per_page=per_page,
        per_page_guessed=guessed,
        boot_seconds=boot_seconds(pool),
        preemptions_per_pod_hour=preemption_rate(pool).per_pod_hour,
        fleet_before_preemption=fleet_before_preemption(pool) if backlog.waiting else 0,
        jobs=jobs,
        pages_not_split=unsplit,
        rents_interruptible=_rents_interruptible(pool),
    )
    return snapshot, capped


def fleet_snapshot(pool: Pool, work: planning.PoolSnapshot) -> planning.PoolSnapshot:
    """``work`` with the pool's alive pods, the last page started, the provider's refusals and the
    pool's $/h: what the tick plans on (read under the tick's lock)."""
    busy = hooks.jobs().pods_with_pages_running(pool.pk)
    rows = pool.pods.filter(state__in=[Pod.State.BOOTING, Pod.State.READY, Pod.State.DRAINING]).order_by("pk")
    pods = tuple(
        planning.PodView(
            id=pod.pk,
            state=pod.state,
            lanes=pod.lanes,
            reason=pod.reason,
            created_at=pod.created_at,
            ready_at=pod.ready_at,
            last_busy_at=pod.last_busy_at,
            busy=pod.pk in busy,
            cancel_requested=pod.cancel_requested_at is not None,
        )
        for pod in rows
    )
    return replace(
        work,
        now=timezone.now(),
        pods=pods,
        last_start=hooks.jobs().pool_last_start(pool.pk) if work.waiting else None,
        refused=_auth_blocked(pool) or _balance_blocked(pool),
        **_dollars_per_hour(pool),
    )


def pool_snapshot(pool: Pool) -> planning.PoolSnapshot:
    """Everything the plan decides the pool's tick on, read now."""
    return fleet_snapshot(pool, work_snapshot(pool)[0])


def pool_demand(pool: Pool) -> Demand:
    """Pods the pool's work wants now (``planning.size`` on what is read now), with what they
    were sized on."""
    work, capped = work_snapshot(pool)
    snapshot = fleet_snapshot(pool, work)
    sized = planning.size(snapshot, scale_policy())
    return Demand(
        snapshot.waiting, snapshot.running, snapshot.seconds_per_page, sized.wanted, capped, sized.affordable,
        sized.sized_for, sized.missed_deadline, snapshot.per_page_guessed, sized.on_demand_only,
    )  # fmt: skip


def preemption_overhead(pool: Pool, per_page: float) -> float:
    """How much more pod time the work takes for the preemptions measured over the pool's last
    hours: each one costs a replacement's boot and the pages in flight again (1.0: none)."""
    rate = preemption_rate(pool).per_pod_hour
    return planning.preemption_overhead(rate, seconds_per_page=per_page, boot_seconds=boot_seconds(pool))


def _rents_interruptible(pool: Pool) -> bool:
    try:
        config = pool_offers(pool)[1]
    except PoolConfigError:
        return False
    return config is not None and config.has_interruptible


def _dollars_per_hour(pool: Pool) -> dict:
    """The pool's $/h cap, what its billed pods cost now and what one more costs at least ({}: no cap)."""
    if pool.max_dollars_per_hour is None:
        return {}
    current = sum(pool.pods.alive().exclude(billed_from=None).values_list("cost_per_hr", flat=True), Decimal(0))
    offers, config = pool_offers(pool)
    cheapest = Decimal(0)
    if config is not None:
        cached = capacity.catalogue_cached(pool.provider)
        priced = planning.priced(offers, cached.offers if cached else [])
        cheapest = min((o.cost_per_hr for o in priced if o.cost_per_hr), default=Decimal(0))
    return {"max_dollars_per_hour": pool.max_dollars_per_hour, "dollars_per_hour": current,
            "cheapest_per_hour": cheapest}  # fmt: skip


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
    """Read the pool, plan (``pods/planning.py`` ``plan``: boot what is needed, shed what is not),
    apply: boots and stopped boots under the pool's lock, then releases."""
    pool.refresh_from_db()
    work, capped = work_snapshot(pool)
    # Escalated pages of jobs past their budget boot nothing here: they keep their first reading.
    hooks.jobs().pages_escalated_over_budget(pool_id=pool.pk, job_ids=capped)
    with transaction.atomic():
        Pool.objects.select_for_update().filter(pk=pool.pk).first()  # one tick per pool at a time
        plan = planning.plan(fleet_snapshot(pool, work), scale_policy(force_shed=force_shed))
        booted = _apply_in_lock(pool, plan)
    shed = _apply_releases(pool, plan)
    if plan.cancel or shed:
        log.info(
            "pool %s shed: stopped %d boots no page needs, released %d pods", pool.key, len(plan.cancel), len(shed)
        )
    waiting = hooks.jobs().pages_waiting(pool_id=pool.pk)
    if waiting and pool.pods.filter(state=Pod.State.READY).exists():
        hooks.jobs().dispatch_ensure(pool=pool)  # also replaces a dispatcher that died: a stall may be just that
    return TickResult(pool.key, waiting, plan.wanted, plan.serving, booted, shed, len(plan.cancel), plan.blocked)


def _apply_in_lock(pool: Pool, plan: planning.Plan) -> list[int]:
    """The plan's alerts, boots and stopped boots; the ids of the pods it boots."""
    for kind, message in plan.alerts.items():
        if message:
            Alert.raise_(pool=pool, kind=kind, message=message)
        else:
            Alert.resolve(pool=pool, kind=kind)
    if plan.blocked:
        log.warning("pool %s: not booting: %s", pool.key, plan.blocked)
    booted = [
        Pod.objects.create(
            pool=pool,
            name=pod_name(pool, uuid.uuid4().hex[:8]),
            lanes=pool.lanes_per_pod,
            reason=plan.boot_reason,
            on_demand_only=plan.sizing.on_demand_only,
            **staged(Pod.BootStage.CREATE),
        ).pk
        for _ in range(plan.boot)
    ]
    if booted:
        transaction.on_commit(passes.pass_request)  # the boots' first steps are due now
    stop = [cancel.pod_id for cancel in plan.cancel]
    Pod.objects.filter(pk__in=stop, state=Pod.State.BOOTING).update(cancel_requested_at=timezone.now())
    return booted


def _apply_releases(pool: Pool, plan: planning.Plan) -> list[int]:
    """Release the plan's pods (spend attributed first); have a tick due when a surplus pod will
    have idled long enough."""
    shed = []
    for stop in plan.release:
        pod = Pod.objects.filter(pk=stop.pod_id, pool=pool).first()
        if pod is not None:
            pod_release(pod=pod, reason=stop.reason)
            shed.append(pod.pk)
    if plan.shed_tick_at is not None:
        _tick_when_sheddable(pool, plan.shed_tick_at)
    return shed


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
