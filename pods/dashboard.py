"""The dashboard's reads and fragments.

One snapshot of the fleet is read in a fixed handful of queries (nothing per
pod or per job) and rendered into partial templates, one per section. Each
partial carries its own id and ``hx-swap-oob``, so the same HTML serves the
first page and every websocket update. Staff get every section, with release
buttons and everybody's jobs; other users get the fleet summary and their own
jobs, and never a staff-only section.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from datetime import datetime, timedelta
from decimal import Decimal

from django.db.models import BooleanField, ExpressionWrapper, Q
from django.template.loader import render_to_string
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from ocrjobs.selectors import (
    JobProgress,
    job_progress,
    jobs_for_dashboard,
    pages_done_by_minute,
    pages_in_flight_by_pod,
)
from pods.models import Alert, BootAttempt, Pod, Pool
from pods.selectors import fleet_status_cached
from pods.spend import jobs_spend

STAFF = "staff"
FLEET_SECTIONS = ("live", "pools", "charts", "pods", "jobs")
STAFF_SECTIONS = ("alerts", "boots", "loops")

CHART_MINUTES = 60
CHART_WIDTH = 600
CHART_HEIGHT = 100
RECENT_BOOTS = 15
RECENT_FAILURES = 10
FAILURE_WINDOW = timedelta(hours=1)
LOOP_ROWS = 50


def sections_for(*, staff: bool) -> tuple[str, ...]:
    return FLEET_SECTIONS + STAFF_SECTIONS if staff else FLEET_SECTIONS


def audience_for(*, user_id: int, staff: bool) -> str:
    return STAFF if staff else f"user:{user_id}"


# --- the fleet (every user) ----------------------------------------------------------------------


def _overlap_seconds(start: datetime, end: datetime, lo: datetime, hi: datetime) -> float:
    return max(0.0, (min(end, hi) - max(start, lo)).total_seconds())


def _nice_ceiling(value: float) -> float:
    """The smallest of 1, 2, 5 x 10^k at or above value: a round top for a chart's axis."""
    if value <= 0:
        return 1.0
    exponent = math.floor(math.log10(value))
    for step in (1, 2, 5, 10):
        top = step * 10**exponent
        if top >= value - 1e-12:
            return float(top)
    return float(10 ** (exponent + 1))


def _chart(values: list[float], labels: list[str], unit: str, decimals: int) -> dict:
    """Bars and a step line in a 600x100 box, computed here; the template draws them."""
    top = _nice_ceiling(max(values, default=0.0))
    step = CHART_WIDTH / max(1, len(values))
    bars, line = [], []
    for i, (value, label) in enumerate(zip(values, labels, strict=True)):
        height = round(value / top * (CHART_HEIGHT - 4), 2)
        y = round(CHART_HEIGHT - height, 2)
        bars.append({"x": round(i * step, 2), "y": y, "h": height, "w": round(step - 1, 2), "title": label,
                     "value": round(value, decimals)})  # fmt: skip
        line += [(round(i * step, 2), y), (round((i + 1) * step, 2), y)]
    return {
        "bars": bars,
        "line": line,
        "top": round(top, decimals),
        "current": round(values[-1], decimals) if values else 0,
        "peak": round(max(values, default=0.0), decimals),
        "unit": unit,
        "width": CHART_WIDTH,
        "height": CHART_HEIGHT,
    }


def _dollar_seconds_by_minute(billed: list[tuple], first: datetime, now: datetime) -> list[float]:
    """$/h x seconds billed in each minute from ``first`` to ``now``, in one pass over the pods
    (not pods x minutes): a pod adds its price to the minutes it covers whole through a running
    sum, and its share to the two minutes at its ends."""
    span = (now - first).total_seconds()
    partial = [0.0] * CHART_MINUTES
    steps = [0.0] * (CHART_MINUTES + 1)
    for _, billed_from, ended_at, cost_per_hr in billed:
        a = max(0.0, (billed_from - first).total_seconds())
        b = min(span, ((ended_at or now) - first).total_seconds())
        if b <= a:
            continue
        price = float(cost_per_hr)
        i, j = min(CHART_MINUTES - 1, int(a // 60)), min(CHART_MINUTES - 1, int(b // 60))
        if i == j:
            partial[i] += price * (b - a)
            continue
        partial[i] += price * (60 * (i + 1) - a)
        partial[j] += price * (b - 60 * j)
        steps[i + 1] += price
        steps[j] -= price
    running, result = 0.0, []
    for i in range(CHART_MINUTES):
        running += steps[i]
        result.append(partial[i] + running * 60)
    return result


def _charts(now: datetime, billed: list[tuple], pages_by_minute: dict[datetime, int]) -> dict:
    """pages/s and $/h for each minute of the last hour, the current minute prorated."""
    current = now.replace(second=0, microsecond=0)
    minutes = [current - timedelta(minutes=CHART_MINUTES - 1 - i) for i in range(CHART_MINUTES)]
    dollar_seconds = _dollar_seconds_by_minute(billed, minutes[0], now)
    pages, dollars, labels = [], [], []
    for start in minutes:
        end = min(start + timedelta(minutes=1), now)
        seconds = (end - start).total_seconds()
        # a minute a few milliseconds old has too few pages to make a rate of; a second is the floor
        pages.append(pages_by_minute.get(start, 0) / max(1.0, seconds))
        if seconds > 0:
            dollars.append(dollar_seconds[len(labels)] / seconds)
        else:  # the minute begins now: what the pods billed now cost per hour
            dollars.append(sum(float(c) for _, b, e, c in billed if b <= now and (e is None or e > now)))
        labels.append(timezone.localtime(start).strftime("%H:%M"))
    return {
        "pages": _chart(pages, labels, "pages/s", 2),
        "dollars": _chart(dollars, labels, "$/h", 2),
        "start_label": labels[0],
        "end_label": "now",
    }


POD_PAGE_SIZE = 50


def _pod_summary(pods: list[tuple]) -> list[dict]:
    """The live pods by pool, state and GPU type: a handful of rows whatever the fleet's size."""
    groups: dict[tuple, dict] = {}
    for pool, state, gpu_type, lanes, cost_per_hr, unbilled in pods:
        row = groups.setdefault((pool, state, gpu_type), {"pool": pool, "state": state, "gpu_type": gpu_type,
                                                          "pods": 0, "lanes": 0, "cost_per_hr": Decimal(0)})  # fmt: skip
        row["pods"] += 1
        row["lanes"] += lanes or 0
        if not unbilled:
            row["cost_per_hr"] += cost_per_hr or 0
    return [groups[key] for key in sorted(groups, key=lambda k: (k[0], k[1], k[2] or ""))]


def pod_page(*, page: int, now: datetime | None = None) -> dict:
    """One page of the live pods (POD_PAGE_SIZE rows), fetched on demand, never pushed."""
    now = now or timezone.now()
    alive = Pod.objects.alive()
    total = alive.count()
    pages = max(1, math.ceil(total / POD_PAGE_SIZE))
    page = min(max(1, page), pages)
    start = (page - 1) * POD_PAGE_SIZE
    pods = list(alive.select_related("pool").order_by("pool__key", "created_at", "id")[start : start + POD_PAGE_SIZE])
    inflight = pages_in_flight_by_pod([pod.pk for pod in pods], now=now)
    rows = [
        {
            "id": pod.pk,
            "name": pod.name,
            "pool": pod.pool.key,
            "gpu_type": pod.gpu_type,
            "cloud_type": pod.cloud_type,
            "data_center": pod.data_center,
            "state": pod.state,
            "uptime_s": (now - (pod.billed_from or pod.created_at)).total_seconds(),
            "inflight": inflight.get(pod.pk, 0),
            "lanes": pod.lanes,
            "cost_per_hr": pod.cost_per_hr,
            "spend": pod.spend(at=now),
        }
        for pod in pods
    ]
    return {
        "pods": rows,
        "pod_page": page,
        "pod_pages": pages,
        "pod_total": total,
        "pod_first": start + 1 if rows else 0,
        "pod_last": start + len(rows),
        "pod_previous": page - 1 if page > 1 else None,
        "pod_next": page + 1 if page < pages else None,
    }


def fleet_snapshot(*, now: datetime) -> tuple[dict, dict]:
    """What every logged-in user may see: pools, pods (without actions), charts; and fleet_status()."""
    status = fleet_status_cached()
    midnight = timezone.localtime(now).replace(hour=0, minute=0, second=0, microsecond=0)
    chart_start = now.replace(second=0, microsecond=0) - timedelta(minutes=CHART_MINUTES - 1)
    since = min(midnight, chart_start)

    billed = list(
        Pod.objects.filter(billed_from__isnull=False, billed_from__lt=now)
        .filter(Q(ended_at__isnull=True) | Q(ended_at__gt=since))
        .values_list("pool_id", "billed_from", "ended_at", "cost_per_hr")
    )
    spend_today: dict[int, Decimal] = defaultdict(Decimal)
    for pool_id, billed_from, ended_at, cost_per_hr in billed:
        seconds = _overlap_seconds(billed_from, ended_at or now, midnight, now)
        spend_today[pool_id] += cost_per_hr * Decimal(seconds) / Decimal(3600)

    pages_by_minute = pages_done_by_minute(since=chart_start)

    pods = list(
        Pod.objects.alive()
        .order_by()
        .annotate(unbilled=ExpressionWrapper(Q(billed_from__isnull=True), output_field=BooleanField()))
        .values_list("pool__key", "state", "gpu_type", "lanes", "cost_per_hr", "unbilled")
    )
    pod_summary = _pod_summary(pods)

    key_of = dict(Pool.objects.values_list("pk", "key"))
    spend_by_key: dict[str, Decimal] = defaultdict(Decimal)
    for pool_id, amount in spend_today.items():
        spend_by_key[key_of.get(pool_id, "")] += amount
    pools = []
    for pool in status["pools"]:
        lanes = pool["lanes"]
        pools.append(
            {
                **pool,
                "spend_today": spend_by_key[pool["key"]].quantize(Decimal("0.01")),
                "lanes_percent": min(100, int(100 * lanes["used"] / lanes["total"])) if lanes["total"] else 0,
            }
        )

    states = Counter(state for _, state, *_ in pods)
    totals = {
        "pods": len(pods),
        "ready": states.get(Pod.State.READY, 0),
        "booting": states.get(Pod.State.BOOTING, 0),
        "draining": states.get(Pod.State.DRAINING, 0),
        "lanes_used": sum(p["lanes"]["used"] for p in pools),
        "lanes_total": sum(p["lanes"]["total"] for p in pools),
        "backlog": sum(p["backlog"] for p in pools),
        "pages_per_s": round(sum(p["pages_per_s"] for p in pools), 2),
        "dollars_per_hour": round(sum(p["dollars_per_hour"] for p in pools), 2),
        "spend_today": sum((p["spend_today"] for p in pools), Decimal(0)),
    }
    return {
        "now": now,
        "pools": pools,
        "totals": totals,
        "pod_summary": pod_summary,
        "charts": _charts(now, billed, pages_by_minute),
    }, status


# --- staff only ---------------------------------------------------------------------------------


def loop_gauges(*, now: datetime | None = None) -> list[dict]:
    """Every event loop's last report (front, dispatchers, workers); a silent one marked stale."""
    from fleetadmin.models import LoopHeartbeat

    now = now or timezone.now()
    rows = LoopHeartbeat.objects.for_dashboard(now=now).order_by("stale", "kind", "name", "host", "pid")[:LOOP_ROWS]
    gauges = []
    for row in rows:
        lag = float(row.lag_s or 0.0)
        gauges.append(
            {
                "id": row.pk,
                "name": row.name,
                "kind": row.kind,
                "host": row.host,
                "pid": row.pid,
                "lag_s": lag,
                "worst_lag_s": float(row.worst_lag_s or 0.0),
                "stalls": row.stalls,
                "blocked_s": float(row.blocked_s or 0.0),
                "age_s": max(0.0, (now - row.updated_at).total_seconds()),
                "stale": bool(row.stale),
                "level": "bad" if lag >= 1.0 else "warn" if lag >= 0.1 else "ok",
                # 1 ms .. 10 s on a log scale, so that a healthy loop still shows a sliver
                "percent": max(2, min(100, int((math.log10(max(lag, 0.001)) + 3) / 4 * 100))),
            }
        )
    return gauges


def staff_snapshot(*, now: datetime, status: dict) -> dict:
    """Alerts, capacity verdicts, boot failures, boot attempts, loop gauges."""
    alerts = []
    for alert in status["alerts"]:
        alerts.append(
            {
                **alert,
                "label": Alert.Kind(alert["kind"]).label if alert["kind"] in Alert.Kind.values else alert["kind"],
                "since": parse_datetime(alert["since"]),
                "last": parse_datetime(alert["last"]),
            }
        )
    verdicts = sorted(status["capacity_verdicts"], key=lambda v: (not v["blocked"], -v["remaining_s"]))
    boots = list(BootAttempt.objects.select_related("pod__pool").order_by("-created_at", "-id")[:RECENT_BOOTS])
    boot_failures = list(
        BootAttempt.objects.select_related("pod__pool")
        .exclude(outcome=BootAttempt.Outcome.CREATED)
        .filter(created_at__gte=now - FAILURE_WINDOW)
        .order_by("-created_at", "-id")[:RECENT_FAILURES]
    )
    failed_pods = list(
        Pod.objects.select_related("pool")
        .filter(state=Pod.State.FAILED, ended_at__gte=now - FAILURE_WINDOW)
        .order_by("-ended_at", "-id")[:RECENT_FAILURES]
    )
    return {
        "alerts": alerts,
        "verdicts": verdicts,
        "boots": boots,
        "boot_failures": boot_failures,
        "failed_pods": failed_pods,
        "loops": loop_gauges(now=now),
    }


# --- rendering ----------------------------------------------------------------------------------


def render_sections(names: tuple[str, ...], context: dict) -> dict[str, str]:
    return {name: render_to_string(f"partials/dash_{name}.html", context) for name in names}


def jobs_with_cost(jobs: list, *, now: datetime) -> list[JobProgress]:
    """The jobs' progress with what each has cost so far (the spend report's figure)."""
    progress = job_progress(jobs, now=now)
    spend = jobs_spend(p.job.pk for p in progress)
    for p in progress:
        p.cost = spend[p.job.pk]
    return progress


def page_context(user, *, pod_page_number: int = 1) -> dict:
    """The whole dashboard for one user: the first render and the no-websocket fallback."""
    now = timezone.now()
    fleet, status = fleet_snapshot(now=now)
    context = {**fleet, **pod_page(page=pod_page_number, now=now), "is_staff": bool(user.is_staff)}
    if user.is_staff:
        context.update(staff_snapshot(now=now, status=status))
        jobs = jobs_for_dashboard()
    else:
        jobs = jobs_for_dashboard(owner_ids=[user.pk])
    context["jobs"] = jobs_with_cost(jobs, now=now)
    context["sections"] = sections_for(staff=bool(user.is_staff))
    return context


def render_payloads(*, staff: bool, user_ids: list[int], front: str = "") -> dict[str, dict[str, str]]:
    """Every section for each audience: "staff" (one variant for all staff) and "user:<id>".

    The fleet is read once; other users' jobs in one query for all of them. A
    non-staff payload is rendered from a context that holds no staff data.
    ``front`` names the process that rendered it (on the live stamp).
    """
    now = timezone.now()
    fleet, status = fleet_snapshot(now=now)
    fleet["front"] = front
    payloads: dict[str, dict[str, str]] = {}
    if staff:
        context = {**fleet, **staff_snapshot(now=now, status=status), "is_staff": True}
        context["jobs"] = jobs_with_cost(jobs_for_dashboard(), now=now)
        payloads[STAFF] = render_sections(sections_for(staff=True), context)
    if user_ids:
        public = {**fleet, "is_staff": False}
        shared = render_sections(tuple(s for s in FLEET_SECTIONS if s != "jobs"), public)
        by_owner: dict[int, list[JobProgress]] = defaultdict(list)
        for progress in jobs_with_cost(jobs_for_dashboard(owner_ids=user_ids), now=now):
            by_owner[progress.job.owner_id].append(progress)
        for user_id in user_ids:
            jobs = render_sections(("jobs",), {**public, "jobs": by_owner.get(user_id, [])})
            payloads[audience_for(user_id=user_id, staff=False)] = {**shared, **jobs}
    return payloads
