"""The dashboard's reads and fragments.

One snapshot of the fleet is read in a fixed handful of queries (nothing per
pod or per job: seven for staff, the pods summed from the status snapshot and in
SQL; each bounded by what it shows, not by history; bench/dashboard_reads.py times each) and rendered
into partial templates, one per section, each only when what it shows changed
(pods/sections.py). Each partial carries its own id and
``hx-swap-oob``, so the same HTML serves the first page and every websocket
update. Staff get every section, with release buttons and everybody's jobs; other
users get the fleet summary and their own jobs, and never a staff-only section.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from datetime import datetime, timedelta
from decimal import Decimal

from django.utils import timezone
from django.utils.dateparse import parse_datetime
from django.utils.safestring import mark_safe

from fleetadmin.models import LoopHeartbeat
from fleetadmin.sqlbatch import IdsOf
from pods import hooks, sections
from pods.charts import CHART_MINUTES as CHART_MINUTES  # (the tests read it here)
from pods.charts import billed, chart_start, charts
from pods.models import Alert, BootAttempt, Pod
from pods.selectors import SERVING, fleet_status_cached
from pods.spend import jobs_spend

STAFF = "staff"
FLEET_SECTIONS = ("live", "pools", "charts", "pods", "jobs")
STAFF_SECTIONS = ("alerts", "boots", "loops")

RECENT_BOOTS = 15
RECENT_FAILURES = 10
FAILURE_WINDOW = timedelta(hours=1)
LOOP_ROWS = 50
# What the boot tables show: these reads run every second (a column is a conversion per row).
SHOWN_OF_ATTEMPTS = ("created_at", "candidate", "outcome", "seconds", "error", "pod__name", "pod__pool__key",
                     "pod__state", "pod__ready_at")  # fmt: skip


def sections_for(*, staff: bool) -> tuple[str, ...]:
    return FLEET_SECTIONS + STAFF_SECTIONS if staff else FLEET_SECTIONS


def audience_for(*, user_id: int, staff: bool) -> str:
    return STAFF if staff else f"user:{user_id}"


# --- the fleet (every user) ----------------------------------------------------------------------


POD_PAGE_SIZE = 50


def _pod_summary(status: dict) -> list[dict]:
    """The live pods by pool, state and GPU type, from the status snapshot the pools section
    shows too (no read of the pods of its own): a handful of rows whatever the fleet's size."""
    groups: dict[tuple, dict] = {}
    for pool in status["pools"]:
        for pod in pool["pod_list"]:
            key = (pool["key"], pod["state"], pod["gpu_type"])
            group = groups.setdefault(key, {"pool": key[0], "state": key[1], "gpu_type": key[2], "pods": 0, "lanes": 0,
                                            "busy": 0, "cost_per_hr": 0.0})  # fmt: skip
            group["pods"] += 1
            group["lanes"] += pod["lanes"] or 0
            group["busy"] += pod.get("busy", 0)
            if pod["billed_from"]:
                group["cost_per_hr"] += pod["cost_per_hr"] or 0.0
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
    inflight = hooks.jobs().pages_in_flight_by_pod([pod.pk for pod in pods], now=now)
    rows = [
        {
            "id": pod.pk,
            "name": pod.name,
            "pool": pod.pool.key,
            "gpu_type": pod.gpu_type,
            "cloud_type": pod.cloud_type,
            "data_center": pod.location,
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


def fleet_snapshot(*, now: datetime | None = None, keep: bool = False) -> tuple[dict, dict]:
    """What every logged-in user may see: pools, pods (without actions), charts; and fleet_status().
    ``keep``: the charts keep the page counts of settled minutes from one call to the next (the
    broadcaster's, every second; pods.charts.pages_by_minute).

    Every figure is of one moment: the status snapshot's (``now`` is when it was read, not when
    this runs: up to a second later, a released pod was gone from the spend and still in the
    pools). The burn rate is the pods' of that snapshot, on the card and as the chart's "now";
    the spend and the chart's minutes are billed up to that moment, running pods included."""
    status = fleet_status_cached()
    now = now or parse_datetime(status["at"])  # (a test or a benchmark may name another moment)
    midnight = timezone.localtime(now).replace(hour=0, minute=0, second=0, microsecond=0)
    spend_today, dollar_seconds = billed(since=midnight, first=chart_start(now), now=now)
    pod_summary = _pod_summary(status)

    pools = []
    for pool in status["pools"]:
        lanes = pool["lanes"]
        pools.append(
            {
                **pool,
                # to the hundredth of a cent: a job's $0.0011 is not "$0" spent today
                "spend_today": spend_today.get(pool["key"], Decimal(0)).quantize(Decimal("0.0001")),
                "lanes_percent": min(100, int(100 * lanes["used"] / lanes["total"])) if lanes["total"] else 0,
            }
        )

    states: Counter[str] = Counter()
    for group in pod_summary:
        states[group["state"]] += group["pods"]
    totals = {
        "pods": sum(states.values()),
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
    serving = {pod["id"] for p in status["pools"] for pod in p["pod_list"] if pod["state"] in SERVING}
    return {
        "now": now,
        "pools": pools,
        "totals": totals,
        "pod_summary": pod_summary,
        "serving": serving,
        "charts": charts(now, dollar_seconds, dollars_now=totals["dollars_per_hour"], keep=keep),
    }, status


# --- staff only ---------------------------------------------------------------------------------


def _loops(now):
    return list(
        LoopHeartbeat.objects.for_dashboard(now=now).order_by("stale", "kind", "name", "host", "pid")[:LOOP_ROWS]
    )


def loop_gauges(*, now: datetime | None = None) -> list[dict]:
    """Every event loop's last report (front, dispatchers, workers); a silent one marked stale."""
    now = now or timezone.now()
    rows = _loops(now=now)
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


# The recent boot attempts and the recent failures, in one statement: the ids of a short walk
# down the (created_at, id) index each (fleetadmin.sqlbatch.IdsOf), then their rows. (As
# ``pk IN (…) OR pk IN (…)``, PostgreSQL filtered every attempt ever made through the two
# walks; as two reads, each cost a round trip and a plan: 0.4-0.5 ms on PostgreSQL, for an
# execution of 0.02 ms.)
_NEWEST_ATTEMPTS = ("-created_at", "-id")


def _boot_attempts_shown(now):
    failing = BootAttempt.objects.exclude(outcome=BootAttempt.Outcome.CREATED).filter(
        created_at__gte=now - FAILURE_WINDOW
    )
    ids = IdsOf(
        BootAttempt.objects.order_by(*_NEWEST_ATTEMPTS)[:RECENT_BOOTS],
        failing.order_by(*_NEWEST_ATTEMPTS)[:RECENT_FAILURES],
    )
    shown = BootAttempt.objects.select_related("pod__pool").only(*SHOWN_OF_ATTEMPTS)
    return list(shown.filter(pk__in=ids).order_by(*_NEWEST_ATTEMPTS))


def boot_attempts(*, now: datetime) -> tuple[list[BootAttempt], list[BootAttempt]]:
    """(the RECENT_BOOTS newest attempts, the RECENT_FAILURES newest failures of the last hour).
    Each attempt knows ``ready_after_s``: from its start to its pod's joining, for a created one
    whose pod joined (the create call alone takes a fraction of a second: "0.0 s" for boots of
    ~8 s); and ``fell_back``: a failed one whose pod went on to its next candidate, not failed."""
    attempts = _boot_attempts_shown(now=now)
    for attempt in attempts:
        created, pod = attempt.outcome == BootAttempt.Outcome.CREATED, attempt.pod
        attempt.ready_after_s = (
            (pod.ready_at - attempt.created_at).total_seconds() if created and pod.ready_at else None
        )
        attempt.fell_back = not created and pod.state != Pod.State.FAILED
    since = now - FAILURE_WINDOW
    failures = [a for a in attempts if a.outcome != BootAttempt.Outcome.CREATED and a.created_at >= since]
    return attempts[:RECENT_BOOTS], failures[:RECENT_FAILURES]


def _failed_pods(now):
    return list(
        Pod.objects.only("name", "ended_at", "error")
        .filter(state=Pod.State.FAILED, ended_at__gte=now - FAILURE_WINDOW)
        .order_by("-ended_at", "-id")[:RECENT_FAILURES]
    )


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
    boots, failing = boot_attempts(now=now)
    failed_pods = _failed_pods(now=now)
    boot_failures = [a for a in failing if not a.fell_back]
    return {
        "alerts": alerts,
        "verdicts": verdicts,
        "boots": boots,
        "boot_failures": boot_failures,
        # A candidate without capacity whose pod went on to the next: normal work, shown as such.
        "fallbacks": [a for a in failing if a.fell_back],
        "problems": len(alerts) + len(boot_failures) + len(failed_pods),
        "failed_pods": failed_pods,
        "loops": loop_gauges(now=now),
    }


# --- rendering ----------------------------------------------------------------------------------


def render_sections(names: tuple[str, ...], context: dict) -> dict[str, str]:
    """Each section's HTML, rendered only when its data changed (pods/sections.py)."""
    return sections.render_sections(names, context)


def jobs_with_cost(jobs: list, *, now: datetime, serving: set[int] | None = None) -> list:
    """The jobs' progress with what each has cost so far (the spend report's figure). ``serving``:
    the pods the fleet snapshot shows ready or draining; a job's pages running are those out at
    one of them (job_progress)."""
    progress = hooks.jobs().job_progress(jobs, now=now, serving=serving)
    entries = None
    if all(hasattr(job, "ended_pods_dollars") for job in jobs):  # as jobs_for_dashboard reads them
        entries = {job.pk: job.ended_pods_dollars for job in jobs}
    spend = jobs_spend([p.job.pk for p in progress], busy_on_pods={p.job.pk: p.busy_on_pods for p in progress},
                       entries=entries)  # fmt: skip
    for p in progress:
        p.cost = spend[p.job.pk]
    return progress


def page_context(user, *, pod_page_number: int = 1) -> dict:
    """The whole dashboard for one user: the first render and the no-websocket fallback."""
    fleet, status = fleet_snapshot()
    now = fleet["now"]
    context = {**fleet, **pod_page(page=pod_page_number, now=now), "is_staff": bool(user.is_staff)}
    if user.is_staff:
        context.update(staff_snapshot(now=now, status=status))
        jobs = hooks.jobs().jobs_for_dashboard()
    else:
        jobs = hooks.jobs().jobs_for_dashboard(owner_ids=[user.pk])
    context["jobs"] = jobs_with_cost(jobs, now=now, serving=fleet["serving"])
    rows = sections.job_rows(context["jobs"], staff=bool(user.is_staff))
    context["job_rows"] = [mark_safe(row) for row in rows.values()]  # for the page's own includes
    context["chart_figures"] = sections.chart_figures(context)
    context["sections"] = sections_for(staff=bool(user.is_staff))
    return context


def render_payloads(*, staff: bool, user_ids: list[int], front: str = "") -> dict[str, dict[str, str]]:
    """Every section for each audience: "staff" (one variant for all staff) and "user:<id>".

    The fleet is read once; other users' jobs in one query for all of them. A
    non-staff payload is rendered from a context that holds no staff data.
    ``front`` names the process that rendered it (on the live stamp).
    """
    fleet, status = fleet_snapshot(keep=True)
    now = fleet["now"]
    fleet["front"] = front
    payloads: dict[str, dict[str, str]] = {}
    if staff:
        context = {**fleet, **staff_snapshot(now=now, status=status), "is_staff": True}
        context["jobs"] = jobs_with_cost(hooks.jobs().jobs_for_dashboard(), now=now, serving=fleet["serving"])
        payloads[STAFF] = render_sections(sections_for(staff=True), context)
    if user_ids:
        public = {**fleet, "is_staff": False}
        shared = render_sections(tuple(s for s in FLEET_SECTIONS if s != "jobs"), public)
        by_owner: dict[int, list] = defaultdict(list)
        for progress in jobs_with_cost(
            hooks.jobs().jobs_for_dashboard(owner_ids=user_ids), now=now, serving=fleet["serving"]
        ):
            by_owner[progress.job.owner_id].append(progress)
        for user_id in user_ids:
            jobs = render_sections(("jobs",), {**public, "jobs": by_owner.get(user_id, [])})
            payloads[audience_for(user_id=user_id, staff=False)] = {**shared, **jobs}
    return payloads
