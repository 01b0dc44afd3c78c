"""What a job will cost and how long it will take, before anything is spent.

For each pool and each sizing (fastest, balanced, cheapest): pods, minutes and dollars for the
job's pages alone, from the pool's measured seconds per page and boot time (or the settings'
guesses until there are some) and the price its last pods were billed (the cheapest catalogue
price among its candidates until there are some). A pod is billed from create to release: its
boot, its share of the pages, and the idle tail before the scaler sheds it; the job waits for the
boot from the scaler's decision (the candidates tried before the create too). Reads only the database (the stored catalogue): the front never asks a provider.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, replace
from decimal import Decimal

from django.conf import settings
from django.utils import timezone

from pods import capacity, hooks, planning
from pods.models import Pod, Pool
from pods.poolconfig import PoolConfigError, pool_offers
from pods.services.preemption import PreemptionRate, fleet_before_preemption, preemption_rate
from pods.services.scaler import boot_seconds, boot_times, pool_shape, scale_policy

SIZINGS = ("fastest", "balanced", "cheapest")


@dataclass(frozen=True)
class _Interruptible:
    """What an interruptible pool's forecast adds: the on-demand price its floor pays, how many
    pods that floor keeps, and the preemptions measured over its last hours."""

    on_demand_price: Decimal | None
    floor: int
    rate: PreemptionRate


# The price the pool's pods were created at, over its last pods: what a boot gets is the cheapest
# candidate that has capacity, not the catalogue's cheapest (bench/storm.py: the forecast priced
# $0.17/h, a GPU type with no capacity anywhere, where every pod ran at $0.27/h).
PRICE_OVER_LAST_PODS = 20


def _paid_mean(pool: Pool, *, interruptible: bool = False) -> tuple[Decimal, int] | None:
    """The mean $/h the pool's last pods (its interruptible ones: their bids) were billed at, and
    over how many (None before any)."""
    paid = list(
        Pod.objects.filter(pool_id=pool.pk, billed_from__isnull=False, cost_per_hr__gt=0, interruptible=interruptible)
        .order_by("-billed_from")
        .values_list("cost_per_hr", flat=True)[:PRICE_OVER_LAST_PODS]
    )
    return ((sum(paid, Decimal(0)) / len(paid)).quantize(Decimal("0.0001")), len(paid)) if paid else None


def _price(pool: Pool) -> tuple[Decimal | None, dict, _Interruptible | None]:
    """The $/h of one of the pool's pods, where it comes from, and what an interruptible pool's
    forecast adds (None: on-demand pods only): the mean over its last pods (an interruptible
    pool's: its interruptible pods' bids, and its on-demand pods' for the floor); until there are
    some, the cheapest known among its candidates (an interruptible one's: its bid). The
    catalogue's cheapest may have no capacity: bench/storm.py --interruptible priced the bid of a
    GPU type no data centre had, where every pod ran at the next one's."""
    price, based, spot = _catalogue_price(pool)
    if price is None:
        return price, based, spot
    paid = _paid_mean(pool, interruptible=spot is not None)
    if paid is not None:
        kind = "interruptible pods' bids" if spot is not None else "pods"
        price, based = paid[0], {"source": f"the pool's last {paid[1]} {kind}", "fetched_at": None,
                                 **({"interruptible": True} if spot is not None else {})}  # fmt: skip
    on_demand = _paid_mean(pool) if spot is not None else None
    if on_demand is not None:
        spot = replace(spot, on_demand_price=on_demand[0])
    return price, based, spot


def _catalogue_price(pool: Pool) -> tuple[Decimal | None, dict, _Interruptible | None]:
    try:
        offers, config = pool_offers(pool)
    except PoolConfigError as exc:  # a pool the scaler cannot boot on either: no price, said why
        return None, {"source": f"none: the pool's configuration is refused ({exc})", "fetched_at": None}, None
    if config is None:  # local pods: what the pool's offer says (nothing, on this machine)
        local = min((o.cost_per_hr for o in offers), default=Decimal(0))
        return local, {"source": "local pods", "fetched_at": None}, None
    cached = capacity.catalogue_cached(pool.provider)
    priced = planning.priced(offers, cached.offers if cached else [])
    known = [o for o in priced if o.cost_per_hr]
    based = {
        "source": f"{pool.provider} catalogue",
        "fetched_at": cached.fetched_at.isoformat() if cached else None,
        "gpu_type": known[0].gpu_type if known else None,
    }
    spot = None
    if known and known[0].interruptible:
        on_demand = next((o.cost_per_hr for o in known if not o.interruptible), None)
        spot = _Interruptible(on_demand, config.on_demand_floor, preemption_rate(pool))
        based["interruptible"] = True
    return (known[0].cost_per_hr if known else None), based, spot


def pods_for(sizing: str, *, pool: Pool, basis: _Basis, pages: int) -> int:
    """Pods the scaler runs for ``pages`` pages waiting, all of a job that asks for ``sizing``:
    ``planning.size`` on what the forecast reads of the pool (``forecast_snapshot``), the sizing
    the tick's plan makes, so the two cannot disagree."""
    if pages <= 0:
        return 0
    return planning.size(forecast_snapshot(pool, basis, pages=pages, sizing=sizing), scale_policy()).wanted


def forecast_snapshot(pool: Pool, basis: _Basis, *, pages: int, sizing: str) -> planning.PoolSnapshot:
    """The pool as the tick would plan it with ``pages`` pages waiting of one job asking for
    ``sizing``: the pool's measurements (``basis``, reused for a few seconds) and its limits."""
    spot = basis.interruptible
    return planning.PoolSnapshot(
        now=timezone.now(),
        **pool_shape(pool),
        waiting=pages,
        seconds_per_page=basis.per_page,
        per_page_guessed=not basis.measured_per_page,
        boot_seconds=basis.boot,
        preemptions_per_pod_hour=spot.rate.per_pod_hour if spot is not None else 0.0,
        fleet_before_preemption=basis.fleet_before_preemption,
        jobs=(planning.ScheduledJob(0, None, sizing),),
    )


@dataclass(frozen=True)
class _Basis:
    """What a pool's forecasts are figured from: its measurements and its price."""

    per_page: float
    measured_per_page: bool
    boot: float  # billed: provider create to ready
    measured_boot: bool
    wait: float  # until a pod reads: the scaler's decision to ready (the candidates tried first too)
    price: Decimal | None
    price_based: dict
    interruptible: _Interruptible | None = None
    fleet_before_preemption: int = 0  # pods a recent preemption found (an interruptible pool's)


# Every submission's forecast read each pool's last pages, last boots and price: about a tenth of
# the front's CPU on bench/ingest.py. They move slowly (means over the last 200 pages and 20
# boots), so a front reuses them for FORECAST_BASIS_SECONDS: {key: (read at, basis)}. What moves
# fast is read for each forecast: the pages ahead (a burst of jobs submitted together each waits
# for those before it: reused, the later ones saw none ahead) and whether a pod is ready.
_bases: dict[tuple, tuple[float, _Basis]] = {}


def _basis(pool: Pool) -> _Basis:
    ttl = settings.FORECAST_BASIS_SECONDS
    key = (pool.pk, pool.created_at, pool.provider, json.dumps(pool.config, sort_keys=True, default=str))
    now = time.monotonic()
    cached = _bases.get(key)
    if ttl > 0 and cached is not None and now - cached[0] < ttl:
        return cached[1]
    mean = hooks.jobs().pool_seconds_per_page(pool.pk)
    times = boot_times(pool)
    waits = _boot_waits(pool)
    price, price_based, spot = _price(pool)
    basis = _Basis(per_page=float(mean) if mean else settings.SCALE_SECONDS_PER_PAGE_GUESS,
                   measured_per_page=bool(mean), boot=boot_seconds(pool, times), measured_boot=bool(times),
                   wait=sum(waits) / len(waits) if waits else boot_seconds(pool, times),
                   price=price, price_based=price_based, interruptible=spot,
                   fleet_before_preemption=fleet_before_preemption(pool) if spot is not None else 0)  # fmt: skip
    if ttl > 0:
        for old in [k for k, (at, _) in _bases.items() if now - at >= ttl]:
            _bases.pop(old, None)
        _bases[key] = (now, basis)
    return basis


def _boot_waits(pool: Pool) -> list[float]:
    """Seconds from the pod's row (the scaler's decision) to ready, over the pool's last 20 boots:
    the boot as a job waits for it. The billed boot starts at the provider's create, after the
    candidates with no capacity were tried: bench/storm.py --small billed 10 s of boot, but its
    one pod was created at the provider 23 s after the first tick (six candidates answered no
    capacity first), and the forecast's minutes on the pool's own measurements were 44 % short."""
    recent = Pod.objects.filter(pool_id=pool.pk, ready_at__isnull=False).order_by("-ready_at")[:20]
    return [(p.ready_at - p.created_at).total_seconds() for p in recent.only("ready_at", "created_at")]


def _pages_ahead(pool: Pool) -> int:
    backlog = hooks.jobs().pool_backlog(pool.pk)
    return backlog.waiting + backlog.running + hooks.jobs().pool_pages_not_split(pool.pk)


# The share of a cascade's pages escalated before its first pool has read any: bench/cascade.py's
# pages (four in five degraded) escalated 2-42% at the thresholds it chose; a quarter, until measured.
ESCALATED_SHARE_GUESS = 0.25


def pool_forecast(
    pool: Pool, *, pages: int, ahead: int | None = None, behind: int = 0, serving: bool | None = None
) -> dict:
    """The pool's figures; a pool that escalates adds its escalation pool's share of the pages."""
    forecast = _stage_forecast(pool, pages=pages, ahead=ahead, behind=behind, serving=serving)
    if pool.escalation_pool_id and pool.escalation_threshold is not None:
        _add_escalation(forecast, pool, pages=pages)
    return forecast


def _add_escalation(forecast: dict, pool: Pool, *, pages: int) -> None:
    """The cascade's second stage: the share of the pool's last first readings that were escalated
    (a guess until it has some), read again in the escalation pool, its dollars added and the
    minutes the longer of the two stages (the second starts as the first escalates pages)."""
    measured = hooks.jobs().pool_escalated_share(pool.pk)
    share = measured[0] if measured else ESCALATED_SHARE_GUESS
    second = _stage_forecast(pool.escalation_pool, pages=math.ceil(share * pages))
    for sizing, figures in forecast["sizings"].items():
        other = second["sizings"][sizing]
        figures["escalation_pods"] = other["pods"]
        figures["minutes"] = max(figures["minutes"], other["minutes"])
        if figures["dollars"] is not None:
            figures["dollars"] = None if other["dollars"] is None else round(figures["dollars"] + other["dollars"], 4)
    guessed = [*([] if measured else ["escalated_share"]), *(f"escalation {name}" for name in second["guessed"])]
    if guessed:
        forecast["basis"], forecast["guessed"] = "guess", [*forecast["guessed"], *guessed]
    forecast["escalation"] = {
        "pool": second["pool"],
        "threshold": pool.escalation_threshold,
        "share": round(share, 3),
        "share_source": (
            f"measured over the pool's last {measured[1]} pages" if measured else "guess (no page read yet)"
        ),
        "pages": math.ceil(share * pages),
        "sizings": second["sizings"],
        "based_on": second["based_on"],
    }


def _stage_forecast(
    pool: Pool, *, pages: int, ahead: int | None = None, behind: int = 0, serving: bool | None = None
) -> dict:
    """``ahead``: the pool's pages read before the job's (default: those waiting, running or
    being split now); ``behind``: those waiting to be read after it (none at a submission; a
    forecast made again later has them); ``serving``: a pod of the pool is ready (default: whether
    one is now). Pages are read in the order they came, on pods the scaler sizes for them all: the
    job ends after those ahead, and pays its pages' part of the pods."""
    basis = _basis(pool)
    per_page, boot, measured_boot = basis.per_page, basis.boot, basis.measured_boot
    price = basis.price
    ahead = _pages_ahead(pool) if ahead is None else ahead
    if serving is None:
        serving = Pod.objects.filter(pool_id=pool.pk, state=Pod.State.READY).exists()
    # bench/storm.py --small, two jobs of 120 pages on one pod, each forecast on the pool's own
    # measurements as if alone: minutes 38 % short, dollars 37 % over (each job paid half of the
    # one boot and idle tail, and waited for the other's pages).
    total = ahead + pages + behind
    work = total * per_page
    sizings = {}
    spot = basis.interruptible
    for sizing in SIZINGS:
        pods = pods_for(sizing, pool=pool, basis=basis, pages=total) if pages else 0
        busy = work / (pods * pool.lanes_per_pod) if pods else 0.0
        done = busy * (ahead + pages) / total if pods else 0.0  # until the job's last page
        lead = 0.0 if serving else basis.wait
        seconds = lead + done if pods else 0.0
        billed = pods * (boot + busy + pool.idle_seconds) * pages / total if pods else 0.0
        dollars = None if price is None else round(float(price) * billed / 3600, 4)
        if spot is not None and pods and price is not None:
            seconds, dollars, lost = _with_preemptions(spot, price, pods=pods, busy=busy, done=done, lead=lead,
                                                       basis=basis, idle=pool.idle_seconds, share=pages / total)  # fmt: skip
            sizings[sizing] = {"pods": pods, "minutes": round(seconds / 60, 2), "dollars": dollars,
                               "preemptions": round(lost, 2)}  # fmt: skip
            continue
        sizings[sizing] = {"pods": pods, "minutes": round(seconds / 60, 2), "dollars": dollars}
    guessed = [name for name, measured in (("seconds_per_page", basis.measured_per_page),
                                           ("boot_seconds", measured_boot)) if not measured]  # fmt: skip
    return {
        "pool": pool.key,
        # What the figures rest on: a pool that has read no page or booted no pod yet has only
        # the settings' guesses (bench/storm.py on a fresh pool: +283 % minutes, +110 % dollars).
        "basis": "guess" if guessed else "measured",
        "guessed": guessed,
        "lanes_per_pod": pool.lanes_per_pod,
        "max_pods": pool.max_pods,
        "sizings": sizings,
        "based_on": _based_on(pool, basis, ahead=ahead, behind=behind, serving=serving),
    }


def _based_on(pool: Pool, basis: _Basis, *, ahead: int, behind: int, serving: bool) -> dict:
    """What a stage's figures rest on, each with where it comes from."""
    price = basis.price
    return {
        "price_per_pod_hour": float(price) if price is not None else None,
        "prices": dict(basis.price_based),
        "seconds_per_page": round(basis.per_page, 3),
        "seconds_per_page_source": (
            "measured over the pool's last pages" if basis.measured_per_page else "guess (no page measured)"
        ),
        "boot_seconds": round(basis.boot, 1),
        "boot_wait_seconds": round(basis.wait, 1),
        "boot_seconds_source": "measured over the pool's last boots" if basis.measured_boot else "guess (no boot yet)",
        "idle_seconds": pool.idle_seconds,
        **(
            {"preemptions": basis.interruptible.rate.to_dict(), "on_demand_floor": basis.interruptible.floor}
            if basis.interruptible is not None
            else {}
        ),
        "pages_ahead": ahead,
        "pages_behind": behind,
        "pods_ready": serving,
    }


def _with_preemptions(
    spot: _Interruptible,
    bid: Decimal,
    *,
    pods: int,
    busy: float,
    done: float,
    lead: float,
    basis: _Basis,
    idle: float,
    share: float,
) -> tuple[float, float | None, float]:
    """(seconds, dollars, expected preemptions) of ``pods`` pods busy ``busy`` seconds after
    ``lead`` (the wait for a boot), the job's last page read after ``done`` of them, the pool's
    floor on-demand and the rest interruptible at
    ``bid``: each preemption measured over the pool's last hours costs a replacement's boot and the
    pages in flight again (planning.redo_seconds), spread over the pods; the job pays ``share``
    of the pods' bill (its pages' part)."""
    floor = min(spot.floor, pods)
    interruptible = pods - floor
    preemptions = spot.rate.per_pod_hour * interruptible * (basis.boot + busy) / 3600
    redo = preemptions * planning.redo_seconds(seconds_per_page=basis.per_page, boot_seconds=basis.boot)
    extra = redo / pods  # spread over the pods' busy time: the job's part of it before its end
    done += extra * (done / busy if busy else 1.0)
    busy += extra
    on_demand = spot.on_demand_price if spot.on_demand_price is not None else bid
    per_pod = basis.boot + busy + idle
    dollars = (float(on_demand) * floor + float(bid) * interruptible) * per_pod * share / 3600
    return lead + done, round(dollars, 4), preemptions


def job_forecast_again(job) -> dict | None:
    """A job whose forecast at submission was a guess (its pool had measured no page or no boot),
    forecast again on what the pool has measured since: the same pages, the same pages ahead and
    pods ready as at its submission. None while the pool has measured nothing more, or when the
    forecast made at submission was measured already (it stands as made)."""
    made = ((job.forecast or {}).get("pools") or [None])[0]
    if not made or made.get("basis") != "guess" or made.get("pool") != job.pool.key:
        return None
    based = made.get("based_on", {})
    again = pool_forecast(job.pool, pages=job.forecast.get("pages") or 0, ahead=based.get("pages_ahead") or 0,
                          behind=based.get("pages_behind") or 0, serving=bool(based.get("pods_ready")))  # fmt: skip
    return again if len(again["guessed"]) < len(made.get("guessed", [])) else None


def job_forecast(*, pages: int, urls: int = 0, pool: Pool | None = None, pools=None) -> dict:
    """The forecast of a job of ``pages`` pages (and ``urls`` documents not fetched yet, whose
    pages are unknown): every pool (of ``pools``, a queryset: those open to the submitter), the
    chosen one first (``pool``)."""
    pools = list((Pool.objects.all() if pools is None else pools).select_related("escalation_pool").order_by("pk"))
    if pool is not None:
        pools.sort(key=lambda p: p.pk != pool.pk)
    # What moves fast, read afresh for every pool at once: three statements, not four a pool.
    ahead = hooks.jobs().pools_pages_ahead(p.pk for p in pools)
    serving = set(Pod.objects.filter(pool__in=pools, state=Pod.State.READY).values_list("pool_id", flat=True))
    return {
        "pages": pages,
        "documents_not_counted": urls,
        "note": "URL documents are counted once fetched; their pages are not in these figures" if urls else "",
        "pools": [pool_forecast(p, pages=pages, ahead=ahead[p.pk], serving=p.pk in serving) for p in pools],
    }


def forecast_choice(forecast: dict, *, priority: str, minutes_left: float | None = None) -> tuple[str, str] | None:
    """(pool key, sizing) a job takes when its submitter names no pool: the cheapest open pool
    that meets the forecast. Without a deadline, the sizing is the job's priority and the pool the
    one whose forecast for it costs least (then the quicker); with one, the cheapest (pool,
    sizing) whose minutes fit in ``minutes_left``, or the quickest of all when none fits. A pool
    whose price is unknown is taken only when no pool's is known. Pure: the form's forecast marks
    what this returns, and the submission takes it (``job_submit``)."""
    rows = [
        (pool["pool"], name, figures)
        for pool in forecast.get("pools") or []
        for name, figures in pool["sizings"].items()
        if minutes_left is not None or name == priority
    ]
    if minutes_left is not None:
        fitting = [row for row in rows if row[2]["minutes"] <= minutes_left]
        if not fitting:
            quickest = min(rows, key=lambda row: row[2]["minutes"], default=None)
            return quickest[:2] if quickest else None
        rows = fitting
    priced = [row for row in rows if row[2]["dollars"] is not None] or rows
    best = min(priced, key=lambda row: (row[2]["dollars"] or 0, row[2]["minutes"]), default=None)
    return best[:2] if best else None
