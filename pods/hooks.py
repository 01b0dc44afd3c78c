"""What pods asks of the pages' app, and tells it: one registry, filled at start-up.

Imports run one way, ocrjobs -> pods (tests/test_layout.py): pods never imports ocrjobs, at any
level. Yet the scaler sizes for the pages waiting, a lost pod's pages must wait again, and the
dashboard shows jobs. Each such question or event is a field of ``Jobs`` below; ocrjobs builds
one and hands it to ``register`` from its ``AppConfig.ready()`` (ocrjobs/registrations.py), as
it registers its pass work with ``pods.services.passes``. pods calls ``jobs().<field>(...)``.

Every field is required: an app that forgets one fails at start-up (``TypeError``), and pods
asking before anything was registered raises ``HooksMissing``, never quietly does nothing.
The ocrjobs function behind each field has the same name (or, for an event, says which it is in
ocrjobs/registrations.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


class HooksMissing(RuntimeError):
    """pods asked the pages' app something before it registered its hooks."""


@dataclass(frozen=True, kw_only=True)
class Jobs:
    """The questions and events between pods and the app that owns jobs, documents and pages."""

    # Demand, for the scaler, the boots and the forecast (pool ids; jobs left out by id).
    pages_waiting: Callable[..., int]  # (*, pool_id) -> pages waiting for a lane
    pool_backlog: Callable[..., Any]  # (pool_id, *, exclude_jobs=()) -> .waiting, .running
    pool_pages_not_split: Callable[..., int]  # (pool_id, *, exclude_jobs=()) -> pages with no row yet
    pools_pages_ahead: Callable[..., dict[int, int]]  # (pool_ids) -> {pool id: pages ahead}
    pool_seconds_per_page: Callable[..., float | None]  # (pool_id) -> a pod's mean seconds a page
    pool_escalated_share: Callable[..., tuple[float, int] | None]  # (pool_id) -> (share, pages counted)
    pool_scheduled_jobs: Callable[..., list]  # (pool_id, *, exclude_jobs=()) -> [(id, deadline, priority)]
    pool_last_start: Callable[..., Any]  # (pool_id) -> when a page last went out, or None
    pods_with_pages_running: Callable[..., set[int]]  # (pool_id) -> pod ids
    # Budgets: jobs the scaler boots nothing for.
    budgeted_jobs_waiting: Callable[..., list]  # (pool_id) -> [(job id, max dollars)]
    jobs_past_owners_day: Callable[..., list[int]]  # (pool_id) -> job ids
    # Lanes and claims, for the status, the dashboard and the metrics.
    pools_pages: Callable[..., dict[int, dict[str, int]]]  # (pool_ids, *, now, done_since)
    pools_page_totals: Callable[..., dict[int, dict[str, int]]]  # (*, now) -> done, failed, waiting, running
    pages_at_pods: Callable[..., dict[int, int]]  # (*, now) -> {pod id: pages under a live claim}
    pages_in_flight_by_pod: Callable[..., dict[int, int]]  # (pod_ids, *, now)
    dispatchers_live: Callable[[], list]  # () -> [(pool id, note, host, pid)]
    # Spend per job, and the dashboard's jobs and charts.
    busy_seconds: Callable[..., dict]  # (*, pod_ids, job_ids=None, since=None, per="job_id")
    jobs_visible_to: Callable[..., Any]  # (user, scopes) -> a queryset of jobs
    jobs_for_dashboard: Callable[..., list]  # (*, owner_ids=None) -> jobs
    job_progress: Callable[..., list]  # (jobs, *, now, serving) -> progress of each
    pages_done_by_minute: Callable[..., dict]  # (*, since) -> {minute: pages done}
    pages_done_in_minutes: Callable[..., dict]  # (minutes) -> {minute: pages done}
    # Events: what pods tells the pages' app.
    pod_ready: Callable[..., object]  # (*, pod): it joined; pages waiting get a dispatcher
    pod_lost: Callable[..., int]  # (*, pod_id): its pages in flight wait again; how many
    pod_preempted: Callable[..., int]  # (*, pod_id, at=None): as lost, the attempts given back
    dispatch_ensure: Callable[..., bool]  # (*, pool): a dispatcher for the pool's pages waiting
    pages_escalated_over_budget: Callable[..., int]  # (*, pool_id, job_ids): they keep their first reading
    pool_housekeeping: Callable[..., object]  # (*, pool_id): the scaler tick's, per pool
    minute_housekeeping: Callable[[], object]  # (): the minute's scaler tick's


_registered: Jobs | None = None


def register(hooks: Jobs) -> None:
    """Install the pages' app's answers (again: replaced)."""
    global _registered
    _registered = hooks


def jobs() -> Jobs:
    """The registered hooks; ``HooksMissing`` if none were."""
    if _registered is None:
        raise HooksMissing("pods.hooks: no app registered its Jobs hooks (is ocrjobs in INSTALLED_APPS?)")
    return _registered
