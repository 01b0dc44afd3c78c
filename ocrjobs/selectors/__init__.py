"""Reads of jobs, documents and pages, shaped for the screens and apps that use them.

``pods`` reads pages and jobs only through this package (tests/test_layout.py). One module per
consumer:

- ``jobs``: the API, the job pages and the CLI (who sees which jobs, texts, result downloads);
- ``dashboard``: the dashboard's jobs, their progress, pods' pages in flight, the charts' minutes;
- ``budgets``: users' daily budgets and what their jobs of the day cost (submissions, retries, the
  scaler); imported as ``ocrjobs.selectors.budgets``, not from here: it reads ``pods.spend``, which
  reads this package;
- ``demand``: the scaler, the boots, the forecast, the spend report and the dispatcher;
- ``status``: the fleet status and the metrics.

Each name is also importable from here (``from ocrjobs.selectors import pool_backlog``).
"""

from __future__ import annotations

from ocrjobs.selectors.dashboard import (
    DASHBOARD_ACTIVE_JOBS,
    DASHBOARD_FINISHED_JOBS,
    JOB_RATE_WINDOW_SECONDS,
    JobProgress,
    job_progress,
    jobs_for_dashboard,
    pages_at_pods,
    pages_done_by_minute,
    pages_done_in_minutes,
    pages_in_flight_by_pod,
)
from ocrjobs.selectors.demand import (
    PoolBacklog,
    budgeted_jobs_waiting,
    busy_seconds,
    pages_waiting,
    pods_with_pages_running,
    pool_backlog,
    pool_escalated_share,
    pool_last_start,
    pool_pages_not_split,
    pool_scheduled_jobs,
    pool_seconds_per_page,
    pools_pages_ahead,
)
from ocrjobs.selectors.jobs import (
    RESULT_ROWS_PER_QUERY,
    document_state,
    document_text,
    documents_for_job_page,
    first_document_names,
    job_escalations,
    job_result_jsonl,
    job_result_txt,
    jobs_for_list,
    jobs_visible_to,
)
from ocrjobs.selectors.status import dispatchers_live, pools_page_totals, pools_pages

__all__ = [
    "DASHBOARD_ACTIVE_JOBS",
    "DASHBOARD_FINISHED_JOBS",
    "JOB_RATE_WINDOW_SECONDS",
    "RESULT_ROWS_PER_QUERY",
    "JobProgress",
    "PoolBacklog",
    "budgeted_jobs_waiting",
    "busy_seconds",
    "dispatchers_live",
    "document_state",
    "document_text",
    "documents_for_job_page",
    "first_document_names",
    "jobs_for_list",
    "job_progress",
    "job_escalations",
    "job_result_jsonl",
    "job_result_txt",
    "jobs_for_dashboard",
    "jobs_visible_to",
    "pages_done_by_minute",
    "pages_done_in_minutes",
    "pages_at_pods",
    "pages_in_flight_by_pod",
    "pages_waiting",
    "pods_with_pages_running",
    "pool_backlog",
    "pool_escalated_share",
    "pool_last_start",
    "pool_pages_not_split",
    "pool_scheduled_jobs",
    "pool_seconds_per_page",
    "pools_pages_ahead",
    "pools_page_totals",
    "pools_pages",
]
