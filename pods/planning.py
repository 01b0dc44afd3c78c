"""How many pods a pool runs, which to boot, stop or release, and which offer a boot tries: pure.

``plan(snapshot, policy) -> Plan``: plain values in, plain values out, no I/O. The scaler tick
reads a ``PoolSnapshot`` (``pods/services/scaler.py`` ``pool_snapshot``), plans, and applies the
plan; a job's forecast asks ``size`` of the same plan what the tick would run for its pages, so
the two cannot disagree. Its tests are literals (tests/pods/test_planning.py), as Ray's
autoscaler tests are.

Which offer: ``candidates`` ranks the pool's candidates for a boot (priced from the catalogue,
cheapest first, on-demand only when it must be) and ``to_try`` leaves out those a verdict or a
preemption blocks and those this boot's walk tried; the walk (``pods/services/boot.py``
``_create_step``) claims each candidate's probe in that order, and ``waits_for_cheaper`` says
whether it waits for a cheaper one other boots are creating on.

Length: the values a plan takes and gives, and the pure decisions on them side by side (the
sizing, the shed, the candidates), so that a reader finds every "how many" and "which" here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal

from pods.providers.base import Offer

# Pod states and boot reasons, as pods.models spells them (no model is imported here).
BOOTING, READY, DRAINING = "booting", "ready", "draining"
DEMAND, WARM = "demand", "warm"
# Alert kinds the plan raises (a message) or resolves ("").
ALERT_DEADLINE, ALERT_STALL, ALERT_BUDGET = "deadline", "stall", "budget"


@dataclass(frozen=True)
class Policy:
    """The settings a plan sizes with (SCALE_TARGET_SECONDS, SCALE_MAX_OVERHEAD, STALL_SECONDS),
    and whether this tick sheds busy-but-surplus ready pods (a scale request's ``force_shed``)."""

    target_seconds: float = 120.0
    max_overhead: float = 0.12  # 0: no cost cap, the time target alone
    stall_seconds: float = 60.0
    force_shed: bool = False


@dataclass(frozen=True)
class PodView:
    """One alive pod of the pool, as the plan needs it."""

    id: int
    state: str  # BOOTING, READY or DRAINING
    lanes: int = 2
    reason: str = DEMAND  # why it was booted: DEMAND, WARM, ...
    created_at: datetime | None = None
    ready_at: datetime | None = None
    last_busy_at: datetime | None = None
    busy: bool = False  # holds a page now
    cancel_requested: bool = False  # a shed already stopped this boot


@dataclass(frozen=True)
class ScheduledJob:
    """An unfinished job with work in the pool: what sets the sizing beyond "balanced"."""

    id: int
    deadline: datetime | None = None
    priority: str = "balanced"  # balanced, fastest or cheapest


@dataclass(frozen=True)
class PoolSnapshot:
    """Everything the plan decides on, read at ``now``. Pages of jobs past their budget are left
    out of ``waiting``, ``running``, ``jobs`` and ``pages_not_split`` by the reader."""

    now: datetime
    lanes_per_pod: int = 2
    max_pods: int = 10
    floor: int = 0  # pods kept without work: min pods (and a local pool's warm pods)
    max_parallel_boots: int = 10
    idle_seconds: float = 60.0
    waiting: int = 0  # pages waiting (each once, however often tried)
    running: int = 0
    seconds_per_page: float = 2.0
    per_page_guessed: bool = False  # no page measured yet: seconds_per_page is the setting's guess
    boot_seconds: float = 60.0  # measured create to ready (a setting until measured)
    preemptions_per_pod_hour: float = 0.0
    fleet_before_preemption: int = 0  # pods the pool had when a recent preemption came
    jobs: tuple[ScheduledJob, ...] = ()
    pages_not_split: int = 0  # read only when a job has a deadline or wants "fastest"
    rents_interruptible: bool = False
    pods: tuple[PodView, ...] = ()
    last_start: datetime | None = None  # when a page of the pool last went out to a pod
    refused: str = ""  # the provider refused our credentials or balance lately: why, or ""
    max_dollars_per_hour: Decimal | None = None
    dollars_per_hour: Decimal = Decimal(0)  # what the pool's billed pods cost now
    cheapest_per_hour: Decimal = Decimal(0)  # what one more pod costs at least


@dataclass(frozen=True)
class Sizing:
    """Pods the work wants, and why."""

    wanted: int  # between the floor and max pods
    sized_for: str = "balanced"  # balanced, fastest, cheapest, or "deadline of job N"
    affordable: int | None = None  # pods whose boots and idle tails the work pays for (None: no cap)
    missed_deadline: str = ""  # a deadline max pods cannot meet, and the earliest it could be met
    on_demand_only: bool = False  # a deadline interruptible pods would put at risk


@dataclass(frozen=True)
class Stop:
    pod_id: int
    reason: str


@dataclass(frozen=True)
class Plan:
    sizing: Sizing
    serving: int  # booting and ready pods counted as capacity
    boot: int = 0
    boot_reason: str = DEMAND  # DEMAND while pages wait, else WARM
    cancel: tuple[Stop, ...] = ()  # boots to stop before they join
    release: tuple[Stop, ...] = ()
    alerts: dict[str, str] = field(default_factory=dict)  # kind: message to raise, or "" to resolve
    blocked: str = ""  # why boots the work wants are not started
    shed_tick_at: datetime | None = None  # when a surplus pod will have idled long enough

    @property
    def wanted(self) -> int:
        return self.sizing.wanted


def needs_unsplit(jobs: tuple[ScheduledJob, ...]) -> bool:
    """Whether the pages not split yet count (a deadline, or "fastest"): the reader reads them then."""
    return any(job.deadline is not None or job.priority == "fastest" for job in jobs)


def redo_seconds(*, seconds_per_page: float, boot_seconds: float) -> float:
    """Pod-seconds one preemption costs beyond the pod's pages: a replacement's boot, and the
    pages in flight on it (each lane half a page on average, so half a page of pod time)."""
    return boot_seconds + seconds_per_page / 2


def preemption_overhead(per_pod_hour: float, *, seconds_per_page: float, boot_seconds: float) -> float:
    """How much more pod time the work takes for ``per_pod_hour`` preemptions: each costs a
    replacement's boot and the pages in flight again (1.0: none)."""
    if not per_pod_hour:
        return 1.0
    return 1.0 + per_pod_hour * redo_seconds(seconds_per_page=seconds_per_page, boot_seconds=boot_seconds) / 3600


def _balanced(s: PoolSnapshot, policy: Policy) -> tuple[int, int | None, float]:
    """(pods, affordable, lane-seconds of work): the work waiting (pages × seconds per page, with
    the preemptions measured) spread over a pod's lanes, drained within the time target; but no
    more pods than the work pays for (each costs its boot and its idle tail, which may add
    ``max_overhead`` of the work at most)."""
    per_page = s.seconds_per_page
    overhead = preemption_overhead(s.preemptions_per_pod_hour, seconds_per_page=per_page, boot_seconds=s.boot_seconds)
    work = (s.waiting + s.running) * per_page * overhead
    wanted = math.ceil(work / (s.lanes_per_pod * policy.target_seconds)) if work else 0
    affordable = None
    fixed = s.boot_seconds + s.idle_seconds  # pod-seconds each pod costs beyond its pages
    if policy.max_overhead and fixed > 0:
        affordable = math.floor(policy.max_overhead * work / s.lanes_per_pod / fixed)
        wanted = min(wanted, affordable)
    if s.waiting and not wanted:
        wanted = 1
    if s.waiting:  # a preempted pod is replaced, not forgone; but never more pods than the pages fill
        wanted = max(wanted, min(s.fleet_before_preemption, math.ceil(s.waiting / s.lanes_per_pod)))
    return wanted, affordable, work


def size(s: PoolSnapshot, policy: Policy) -> Sizing:
    """Pods wanted: balanced (``_balanced``); as many as the pages can use at once when a job asks
    for "fastest"; one when every job asks for "cheapest"; enough for the earliest deadline;
    between the floor and max pods. Pages of jobs past their budget want no pod (the reader
    leaves them out)."""
    wanted, affordable, work = _balanced(s, policy)
    sized_for, missed, on_demand_only = "balanced", "", False
    priorities = {job.priority for job in s.jobs if job.deadline is None}
    deadlines = sorted((job.deadline, job.id) for job in s.jobs if job.deadline is not None)
    planned, planned_work = s.waiting + s.running, work
    if deadlines or "fastest" in priorities:
        # What the split has not made rows of yet counts too: it tells the scaler of its first
        # batch only, and a deadline sized on that batch would be missed by the rest.
        planned, planned_work = planned + s.pages_not_split, work + s.pages_not_split * s.seconds_per_page
    if "fastest" in priorities and planned:
        # As many pods as the pages can use at once, the overhead cap aside.
        wanted, sized_for = max(wanted, math.ceil(planned / s.lanes_per_pod)), "fastest"
    elif work and priorities == {"cheapest"} and not deadlines:
        wanted, sized_for = 1, "cheapest"  # one pod: one boot, one idle tail, however long it takes
    if deadlines and planned_work:
        deadline, job_id = deadlines[0]
        needed, earliest = pods_for_deadline(s, work=planned_work, deadline=deadline)
        if needed > wanted:
            wanted, sized_for = needed, f"deadline of job {job_id}"
        on_demand_only = _deadline_at_risk_from_preemption(s, planned_work, deadline, wanted)
        if earliest is not None:
            missed = (
                f"job {job_id}'s deadline {deadline.isoformat()} cannot be met: {planned} pages "
                f"at {s.seconds_per_page:.2f} s each on at most {s.max_pods} pods of {s.lanes_per_pod} lanes; "
                f"the earliest it could be met is {earliest.isoformat(timespec='seconds')}"
            )
    wanted = min(max(wanted, s.floor), s.max_pods)
    return Sizing(wanted, sized_for, affordable, missed, on_demand_only)


def _deadline_at_risk_from_preemption(s: PoolSnapshot, work: float, deadline: datetime, pods: int) -> bool:
    """Whether the deadline has no room for one preemption on each of the pods it needs (a
    replacement's boot and the pages in flight read again): then the rest of the work goes to
    on-demand pods. Only for pools that rent interruptible pods."""
    if not s.rents_interruptible:
        return False
    redo = redo_seconds(seconds_per_page=s.seconds_per_page, boot_seconds=s.boot_seconds) * s.lanes_per_pod
    _, earliest = pods_for_deadline(s, work=work + max(pods, 1) * redo, deadline=deadline)
    return earliest is not None


def pods_for_deadline(s: PoolSnapshot, *, work: float, deadline: datetime) -> tuple[int, datetime | None]:
    """(pods to finish ``work`` lane-seconds by ``deadline``, None) when max pods can; otherwise
    (max pods, the earliest time they could finish it).

    The whole backlog counts (pages are dispatched in the order they came, not by deadline).
    Ready pods work from now; any other pod only after a measured boot."""
    lanes, boot = s.lanes_per_pod, s.boot_seconds
    ready_lanes = sum(p.lanes for p in s.pods if p.state == READY)
    ready = math.ceil(ready_lanes / lanes) if ready_lanes else 0
    left = (deadline - s.now).total_seconds()
    remaining = work - ready_lanes * max(left, 0)
    if remaining <= 0:
        return max(ready, 1 if work else 0), None
    if left > boot:
        needed = ready + math.ceil(remaining / (lanes * (left - boot)))
        if needed <= s.max_pods:
            return needed, None
    # The earliest t at which ready lanes over t, and every other pod allowed over (t - boot), do the work.
    extra_lanes = max(s.max_pods - ready, 0) * lanes
    if ready_lanes and ready_lanes * boot >= work:
        seconds = work / ready_lanes
    elif ready_lanes + extra_lanes:
        seconds = (work + extra_lanes * boot) / (ready_lanes + extra_lanes)
    else:
        return s.max_pods, s.now + timedelta(days=365)
    return s.max_pods, s.now + timedelta(seconds=seconds)


def dispatch_stalled(s: PoolSnapshot, policy: Policy) -> str:
    """Why dispatch looks stalled (pages waiting, lanes free on pods ready for a while, nothing
    started since), or "". More pods would not help: the plan raises this instead of booting."""
    if not s.waiting:
        return ""
    quiet = s.now - timedelta(seconds=policy.stall_seconds)
    lanes = sum(p.lanes for p in s.pods if p.state == READY and p.ready_at is not None and p.ready_at < quiet)
    free = lanes - s.running
    if free <= 0 or (s.last_start is not None and s.last_start >= quiet):
        return ""
    return (
        f"dispatch stalled: {s.waiting} pages waiting, {free} lanes free on pods ready for over "
        f"{policy.stall_seconds:.0f} s, no page started since {s.last_start.isoformat() if s.last_start else 'ever'}"
    )


def budget_blocks(s: PoolSnapshot) -> str:
    """Why the pool's $/h cap blocks one more pod, or ""."""
    cap = s.max_dollars_per_hour
    if cap is None or s.dollars_per_hour + s.cheapest_per_hour <= cap:
        return ""
    return f"budget cap: ${s.dollars_per_hour}/h running + ${s.cheapest_per_hour}/h for one more is over ${cap}/h"


def plan(s: PoolSnapshot, policy: Policy) -> Plan:
    """The pool's tick, decided: boot what the work wants, shed the rest.

    Booting pods count as capacity, within the parallel-boot cap. A fleet sized on a guessed page
    time is not grown while ready pods are about to measure one. A stalled pool, a provider that
    refused us, or the pool's $/h cap boots nothing (and says why). A shed stops boots first
    (``_cancels``), then releases ready pods (``_releases``)."""
    sizing = size(s, policy)
    serving = [p for p in s.pods if p.state in (BOOTING, READY) and not p.cancel_requested]
    booting = [p for p in serving if p.state == BOOTING]
    to_boot = min(sizing.wanted - len(serving), s.max_parallel_boots - len(booting))
    if s.per_page_guessed and len(booting) < len(serving):
        # A fleet sized on the guessed page time is wrong by however far the guess is (in
        # bench/storm.py, 6 pods where 1 did the work): the ready pods measure a page within seconds,
        # so wait for it. A pool with no ready pod boots on the guess, or nothing would start;
        # the warm floor (a scale request's target) is not a guess and is still booted to.
        to_boot = min(to_boot, s.floor - len(serving))
    stalled = dispatch_stalled(s, policy)
    blocked = (stalled or s.refused or budget_blocks(s)) if to_boot > 0 else ""
    surplus = len(serving) - sizing.wanted
    cancel = _cancels(booting, surplus)
    release, shed_tick_at = _releases(s, policy, surplus - len(cancel))
    return Plan(
        sizing=sizing,
        serving=len(serving),
        boot=0 if blocked else max(0, to_boot),
        boot_reason=DEMAND if s.waiting else WARM,
        cancel=cancel,
        release=release,
        alerts={
            ALERT_DEADLINE: sizing.missed_deadline,
            ALERT_STALL: stalled,
            ALERT_BUDGET: blocked if blocked.startswith("budget") else "",
        },
        blocked=blocked,
        shed_tick_at=shed_tick_at,
    )


def _cancels(booting: list[PodView], surplus: int) -> tuple[Stop, ...]:
    """Boots to stop: anticipatory ones (warm floor, scale requests) before those booted for pages
    that are gone since (done, or their job cancelled), newest first: they have cost the least so
    far. Demand counts every page waiting, so a boot that waiting pages need is never surplus."""
    if surplus <= 0:
        return ()
    newest_first = sorted(booting, key=lambda p: (p.created_at is not None, p.created_at), reverse=True)
    stopped = sorted(newest_first, key=lambda p: p.reason == DEMAND)[:surplus]
    return tuple(Stop(p.id, "shed: no page needs this boot") for p in stopped)


def _releases(s: PoolSnapshot, policy: Policy, surplus: int) -> tuple[tuple[Stop, ...], datetime | None]:
    """Pods to release: drained ones with no page running, then surplus ready pods that idled
    ``idle_seconds`` (``force_shed``: idle or not), longest idle first, never one with a page
    running; and when the first surplus pod not idle long enough will be (a tick due then)."""
    release = [Stop(p.id, "drained") for p in s.pods if p.state == DRAINING and not p.busy]
    if surplus <= 0:
        return tuple(release), None
    idle_since = s.now - timedelta(seconds=s.idle_seconds)
    ready = sorted((p for p in s.pods if p.state == READY), key=lambda p: (p.last_busy_at is not None, p.last_busy_at))
    for pod in ready:
        if surplus <= 0:
            break
        if pod.busy:
            continue
        idle = pod.last_busy_at is None or pod.last_busy_at < idle_since
        if not (idle or policy.force_shed):
            # Surplus, but not idle long enough yet: tick the moment it is, not a schedule later.
            return tuple(release), pod.last_busy_at + timedelta(seconds=s.idle_seconds)
        release.append(Stop(pod.id, "shed: idle" if idle else "shed: scale request"))
        surplus -= 1
    return tuple(release), None


# --- which offer ---------------------------------------------------------------------------------


def candidate_key(provider: str, offer: Offer) -> str:
    spot = "|spot" if offer.interruptible else ""
    return f"{provider}|{offer.gpu_type}|{offer.cloud_type}|{offer.data_center or '*'}{spot}"


def bid(offer: Offer, on_demand: Decimal, min_bid: Decimal | None) -> Decimal | None:
    """An interruptible candidate's bid per GPU: the catalogue's minimum bid plus the pool's
    margin, never over the on-demand price (then on-demand is as cheap and never preempted).
    None when the catalogue names no minimum bid: it rents no interruptible pods."""
    if min_bid is None or min_bid <= 0:
        return None
    return min(min_bid + offer.bid_margin, on_demand).quantize(Decimal("0.0001"))


def priced(offers: list[Offer], catalogue: list[Offer]) -> list[Offer]:
    """The pool's candidates with catalogue prices (an interruptible one's: its bid), cheapest
    first; unpriced ones last, in pool order. An interruptible candidate the catalogue has no
    minimum bid for is left out: nothing could be bid on it."""
    listed = {(o.gpu_type, o.cloud_type): o for o in catalogue}
    known, unknown = [], []
    for offer in offers:
        entry = listed.get((offer.gpu_type, offer.cloud_type))
        price = entry.cost_per_hr if entry is not None else None
        if price is None and offer.cloud_type in ("", "LOCAL"):
            price = offer.cost_per_hr
        if offer.interruptible and entry is not None:
            price = bid(offer, entry.cost_per_hr, entry.min_bid)
            if price is None:
                continue
        if price is None:
            unknown.append(offer)
        else:
            known.append(
                Offer(offer.gpu_type, offer.cloud_type, offer.data_center, price, offer.interruptible,
                      offer.bid_margin, entry.min_bid if entry is not None else None)
            )  # fmt: skip
    known.sort(key=lambda o: o.cost_per_hr)  # stable: equal prices keep the pool's order
    return known + unknown


def candidates(
    offers: list[Offer], catalogue: list[Offer], *, provider: str, on_demand: bool
) -> list[tuple[Offer, str]]:
    """The candidates a boot walks, in order, each with its key: the pool's offers priced from the
    catalogue, cheapest first (unpriced ones last, ``priced``); only on-demand ones when the boot
    must rent on demand (a deadline interruptible pods would put at risk, or the pool's
    on-demand floor unmet)."""
    ranked = [offer for offer in priced(offers, catalogue) if not (on_demand and offer.interruptible)]
    return [(offer, candidate_key(provider, offer)) for offer in ranked]


def to_try(ranked: list[tuple[Offer, str]], *, blocked: set[str], tried: set[str]) -> list[tuple[Offer, str]]:
    """``ranked`` without the candidates every boot skips now (a "no capacity" verdict, an unknown
    offer, a preemption) and those this walk tried already (each once a walk)."""
    return [(offer, key) for offer, key in ranked if key not in blocked and key not in tried]


def waits_for_cheaper(walk_started: datetime, *, now: datetime, wait_seconds: float) -> bool:
    """Whether a boot still waits for a cheaper candidate that other boots are creating on (its
    probe, or every create its open slots allow, is out) rather than take a dearer one: for
    ``wait_seconds`` (BOOT_CHEAPER_WAIT_SECONDS) from the start of its walk. A burst then lands on
    the cheapest type with room, its creates doubling each round, instead of spilling onto dearer
    types while the first create is out (bench/storm.py: 3 of a burst's 6 pods at $0.40/h beside a
    $0.27 type with room for 24; the storm's bill +20 %)."""
    return now <= walk_started + timedelta(seconds=wait_seconds)
