"""What the scaler, the boots, the forecast, the spend report and the dispatcher need of pages:
backlog, measured page time, budgets and deadlines, pages not split yet, busy seconds.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from django.db import connection
from django.db.models import (
    Avg,
    Count,
    Max,
    Q,
    QuerySet,
    Sum,
)
from django.utils import timezone

from ocrjobs.models import Document, Job, Page


@dataclass(frozen=True)
class PoolBacklog:
    waiting: int  # pages a dispatcher may claim (each page once, however often it was tried)
    running: int  # pages out at pods under a live claim


def pool_backlog(pool_id: int, *, exclude_jobs: Iterable[int] = ()) -> PoolBacklog:
    """The pool's pages waiting and running, leaving out those of ``exclude_jobs``."""
    pages = Page.objects.filter(pool_id=pool_id).exclude(job_id__in=list(exclude_jobs))
    waiting = pages.waiting().count()
    running = pages.filter(status=Page.Status.RUNNING, claim_expires_at__gte=timezone.now()).count()
    return PoolBacklog(waiting, running)


def pools_pages_ahead(pool_ids: Iterable[int]) -> dict[int, int]:
    """{pool id: pages a job submitted now waits for} of every pool in ``pool_ids`` (0 for one
    with none): its pages waiting and running (as pool_backlog counts them) and those of its
    documents still being split (as pool_pages_not_split counts them), in two statements whatever
    the number of pools. A submission's forecast reads it for every pool open to the submitter:
    four statements a pool before, a fifth of the forecast's cost on bench/ingest.py.

    One statement of SQL of our own (``_pages_ahead_sql``): every submission's forecast runs it,
    and the ORM took two thirds of its 3 ms building the two statements (this machine). Its
    figures are the querysets' (tests/pods/test_forecast_fresh.py)."""
    pool_ids = list(pool_ids)
    ahead = dict.fromkeys(pool_ids, 0)
    if not pool_ids:
        return ahead
    now = connection.ops.adapt_datetimefield_value(timezone.now())
    marks = ", ".join(["%s"] * len(pool_ids))
    params = [Page.Status.RUNNING, now, Page.Status.PENDING, Page.Status.RUNNING, now, Job.Status.CANCELLED,
              *pool_ids, Page.Status.PENDING, Page.Status.RUNNING, *pool_ids, Document.Status.PENDING, *Job.FINISHED]  # fmt: skip
    with connection.cursor() as cursor:
        cursor.execute(_pages_ahead_sql(marks), params)
        for pool_id, pages in cursor.fetchall():
            ahead[pool_id] += int(pages or 0)  # PostgreSQL sums integers as numeric
    return ahead


def _pages_ahead_sql(pool_marks: str) -> str:
    """Per pool: its pages waiting (as ``PageQuerySet.waiting``) or running under a live claim, and
    the pages its documents being split have still to make (as ``_documents_splitting``)."""
    page, job, document = (model._meta.db_table for model in (Page, Job, Document))
    finished = ", ".join(["%s"] * len(Job.FINISHED))
    return f"""
SELECT p.pool_id, SUM(CASE WHEN (p.status = %s AND p.claim_expires_at >= %s)
                            OR ((p.status = %s OR (p.status = %s AND p.claim_expires_at < %s)) AND j.status <> %s)
                           THEN 1 ELSE 0 END)
FROM {page} p JOIN {job} j ON p.job_id = j.id
WHERE p.pool_id IN ({pool_marks}) AND p.status IN (%s, %s)
GROUP BY p.pool_id
UNION ALL
SELECT s.pool_id, SUM(CASE WHEN s.page_count > s.made THEN s.page_count - s.made ELSE 0 END) FROM (
  SELECT j.pool_id AS pool_id, d.page_count AS page_count, COUNT(p.id) AS made
  FROM {document} d JOIN {job} j ON d.job_id = j.id LEFT JOIN {page} p ON p.document_id = d.id
  WHERE j.pool_id IN ({pool_marks}) AND d.status = %s AND j.status NOT IN ({finished})
  GROUP BY d.id, j.pool_id, d.page_count
) s
GROUP BY s.pool_id"""


def _documents_splitting(documents: QuerySet) -> QuerySet:
    """Of ``documents``, those still being split, each with the pages made of it so far (``made``)."""
    return (
        documents.filter(status=Document.Status.PENDING)
        .exclude(job__status__in=Job.FINISHED)
        .annotate(made=Count("pages"))
    )


def pages_waiting(*, pool_id: int) -> int:
    return Page.objects.waiting().filter(pool_id=pool_id).count()


def pool_seconds_per_page(pool_id: int, *, last: int = 200) -> float | None:
    """The mean seconds a pod took for each of the pool's ``last`` pages (a page it escalated
    counts with its first reading); None before any."""
    recent = Page.objects.filter(pool_id=pool_id, status=Page.Status.DONE, seconds__isnull=False)
    ids = list(recent.order_by("-finished_at").values_list("id", flat=True)[:last])
    mean = Page.objects.filter(id__in=ids).aggregate(mean=Avg("seconds"))["mean"] if ids else None
    firsts = Page.objects.filter(escalated_from_id=pool_id, first_seconds__isnull=False)
    first_ids = list(firsts.order_by("-escalated_at").values_list("id", flat=True)[:last])
    if not first_ids:
        return mean
    first_mean = Page.objects.filter(id__in=first_ids).aggregate(mean=Avg("first_seconds"))["mean"]
    return ((mean or 0.0) * len(ids) + first_mean * len(first_ids)) / (len(ids) + len(first_ids))


def pool_escalated_share(pool_id: int, *, last: int = 200) -> tuple[float, int] | None:
    """(share escalated, pages counted) of the pool's ``last`` first readings: its pages done
    there and those it sent to its escalation pool; None before any."""
    kept = Page.objects.filter(pool_id=pool_id, status=Page.Status.DONE, escalated_from=None)
    kept_at = list(kept.order_by("-finished_at").values_list("finished_at", flat=True)[:last])
    sent = Page.objects.filter(escalated_from_id=pool_id)
    sent_at = list(sent.order_by("-escalated_at").values_list("escalated_at", flat=True)[:last])
    recent = sorted([(at, False) for at in kept_at if at] + [(at, True) for at in sent_at if at], reverse=True)
    recent = recent[:last]
    if not recent:
        return None
    return sum(1 for _, escalated in recent if escalated) / len(recent), len(recent)


def pool_last_start(pool_id: int) -> datetime | None:
    """When a page of the pool last went out to a pod."""
    return Page.objects.filter(pool_id=pool_id).aggregate(last=Max("started_at"))["last"]


def pods_with_pages_running(pool_id: int) -> set[int]:
    """The pool's pods holding a page now (claim live or not: the page is still theirs)."""
    return set(Page.objects.filter(pod__pool_id=pool_id, status=Page.Status.RUNNING).values_list("pod_id", flat=True))


def budgeted_jobs_waiting(pool_id: int) -> list[tuple[int, Decimal]]:
    """(id, max dollars) of the unfinished jobs with a budget and pages waiting in the pool: their
    own pool's, or an escalation pool's (a job's escalated pages wait in another pool than its own)."""
    capped = Job.objects.filter(max_dollars__isnull=False).exclude(status__in=Job.FINISHED)
    capped = capped.filter(pk__in=Page.objects.waiting().filter(pool_id=pool_id).values("job_id"))
    return list(capped.values_list("pk", "max_dollars"))


def pool_scheduled_jobs(pool_id: int, *, exclude_jobs: Iterable[int] = ()) -> list[tuple[int, datetime | None, str]]:
    """(id, deadline, priority) of the pool's unfinished jobs with pages waiting or running, or
    documents still being split: what the scaler sizes for. Bounded by the work in hand."""
    busy = Page.objects.filter(pool_id=pool_id, status__in=[Page.Status.PENDING, Page.Status.RUNNING])
    splitting = Document.objects.filter(job__pool_id=pool_id, status=Document.Status.PENDING)
    jobs = Job.objects.filter(pool_id=pool_id).exclude(status__in=Job.FINISHED).exclude(pk__in=list(exclude_jobs))
    jobs = jobs.filter(Q(pk__in=busy.values("job_id")) | Q(pk__in=splitting.values("job_id"))).order_by("pk")
    return list(jobs.values_list("pk", "deadline", "priority"))


def pool_pages_not_split(pool_id: int, *, exclude_jobs: Iterable[int] = ()) -> int:
    """Pages of the pool's documents still being split that have no row yet (counted at
    submission; a URL document's only once fetched): work a deadline must already plan for,
    since the split tells the scaler only of its first batch."""
    splitting = _documents_splitting(
        Document.objects.filter(job__pool_id=pool_id).exclude(job_id__in=list(exclude_jobs))
    )
    return sum(max(0, count - made) for count, made in splitting.values_list("page_count", "made"))


def busy_seconds(
    *, pod_ids: Iterable[int], job_ids: Iterable[int] | None = None, since: datetime | None = None, per: str = "job_id"
) -> dict[tuple[int, int], float]:
    """{(pod id, job id): seconds} the pods held a lane for the done pages of each job (finished
    since ``since``): what a job's share of a pod is priced on. ``per="job__owner_id"``: by the
    jobs' owner instead (a user's day, ocrjobs.selectors.budgets)."""
    pod_ids = pod_ids if isinstance(pod_ids, QuerySet) else list(pod_ids)  # a queryset stays a subquery
    if job_ids is not None:
        job_ids = job_ids if isinstance(job_ids, QuerySet) else list(job_ids)  # so does this one
    pages = Page.objects.filter(pod_id__in=pod_ids, status=Page.Status.DONE, seconds__isnull=False)
    if job_ids is not None:
        pages = pages.filter(job_id__in=job_ids)
    if since is not None:
        pages = pages.filter(finished_at__gte=since)
    rows = pages.values("pod_id", per).annotate(busy=Sum("seconds")).values_list("pod_id", per, "busy")
    busy = {(pod_id, key): busy for pod_id, key, busy in rows}
    # Escalated pages: the first pool's reading is its pod's busy time (spend per stage).
    firsts = Page.objects.filter(first_pod_id__in=pod_ids, first_seconds__isnull=False)
    if job_ids is not None:
        firsts = firsts.filter(job_id__in=job_ids)
    if since is not None:
        firsts = firsts.filter(escalated_at__gte=since)
    rows = firsts.values("first_pod_id", per).annotate(busy=Sum("first_seconds"))
    for pod_id, key, seconds in rows.values_list("first_pod_id", per, "busy"):
        busy[(pod_id, key)] = busy.get((pod_id, key), 0.0) + seconds
    return busy
