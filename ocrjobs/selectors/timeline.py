"""A job's timeline (issue 42): what happened to it and when, from the records that exist —
submitted, split, read on pods, retried, cancelled, rebuilt (the audit record, pods/audit.py),
searchable PDFs built, webhooks sent, ended. A fixed handful of queries, each bounded by the pods,
documents or deliveries of the job, never by its pages' rows (grouped in SQL)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.db.models import Count, Max, Min, Sum
from django.utils.dateparse import parse_datetime

from ocrjobs.models import Job, Page, SearchablePdf

ACTIONS = {"cancel": "Cancelled", "retry": "Retried", "rebuild": "Searchable PDFs asked for again"}
AUDIT_SHOWN = 50
PODS_SHOWN = 50


@dataclass(frozen=True)
class Event:
    at: datetime
    kind: str  # submitted, split, pod, audit, build, webhook, ended
    text: str
    level: str = ""  # "", "error": how the page shows it


def job_timeline(job: Job, *, deliveries: list | None = None) -> list[Event]:
    """The job's events, oldest first (``deliveries``: its webhook deliveries, read already)."""
    owner = job.owner.get_username() if job.owner_id else "a deleted user"
    events = [Event(job.created_at, "submitted", f"Submitted by {owner}")]

    split = job.documents.exclude(split_at=None).aggregate(n=Count("id"), last=Max("split_at"), pages=Sum("page_count"))
    if split["n"]:
        pages = split["pages"] or 0
        documents = f"{split['n']} document{'s' if split['n'] != 1 else ''}"
        events.append(Event(split["last"], "split", f"Split: {documents} into {pages} page{'s' if pages != 1 else ''}"))

    # The pods that read its pages (those whose results are stored: a page sent again keeps its last
    # pod). By status too: SQLite's planner, given the statistics of a long history, scanned the
    # whole page table for the job's pages alone (bench/status_history.py); (job, status) it seeks.
    on_pods = (
        job.pages.filter(status=Page.Status.DONE).exclude(pod=None).order_by().values("pod__name", "pod__gpu_type")
        .annotate(first=Min("started_at"), pages=Count("id"))[:PODS_SHOWN]
    )  # fmt: skip
    for row in on_pods:
        if row["first"] is None:
            continue
        where = f"{row['pod__name']}" + (f" ({row['pod__gpu_type']})" if row["pod__gpu_type"] else "")
        events.append(Event(row["first"], "pod", f"Pages read on pod {where}: {row['pages']}"))

    for entry in job.audit_entries.order_by("-at", "-id")[:AUDIT_SHOWN]:
        verb = ACTIONS.get(entry.action, entry.action)
        detail = f": {entry.detail}" if entry.detail else ""
        events.append(Event(entry.at, "audit", f"{verb} by {entry.actor_name} ({entry.door}){detail}"))

    builds = (
        SearchablePdf.objects.filter(document__job=job).order_by().values("status")
        .annotate(n=Count("document_id"), last=Max("updated_at"))
    )  # fmt: skip
    for row in builds:
        if row["status"] in (SearchablePdf.Status.BUILT, SearchablePdf.Status.FAILED):
            level = "error" if row["status"] == SearchablePdf.Status.FAILED else ""
            events.append(Event(row["last"], "build", f"Searchable PDFs {row['status']}: {row['n']}", level))

    for delivery in job.webhook_deliveries.all() if deliveries is None else deliveries:
        for attempt in delivery.attempts[-3:]:
            at = _parse(attempt.get("at"))
            if at is None:
                continue
            answer = f"HTTP {attempt['status']}" if attempt.get("status") else attempt.get("error") or "no answer yet"
            level = "" if str(attempt.get("status", "")).startswith("2") else "error"
            events.append(Event(at, "webhook", f"Webhook {delivery.event} to {delivery.url}: {answer}", level))

    if job.finished_at:
        level = "error" if job.status in (Job.Status.FAILED, Job.Status.PARTIAL) else ""
        events.append(Event(job.finished_at, "ended", f"Ended: {job.status}", level))
    return sorted(events, key=lambda event: event.at)


def _parse(value) -> datetime | None:
    return parse_datetime(value) if isinstance(value, str) else None
