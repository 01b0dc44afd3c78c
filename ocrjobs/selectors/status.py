"""What the fleet status and the metrics read of pages and dispatchers: per-pool page counts
and totals, live dispatchers.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime

from django.db.models import (
    Count,
    F,
    OuterRef,
    Q,
    Subquery,
    Sum,
)
from django.db.models.functions import Coalesce

from ocrjobs.models import Dispatcher, Job, Page, PoolPageTally


def pools_pages(pool_ids: list[int], *, now: datetime, done_since: datetime) -> dict[int, dict[str, int]]:
    """{pool id: {"waiting", "running", "done"}}: pages waiting, running under a live claim, and
    done since ``done_since``; in two queries whatever the number of pools."""
    if not pool_ids:
        return {}
    # One row each, counted per pool by filters rather than GROUP BY pool: grouped, SQLite walks the
    # (pool, status, ...) index over every page ever made for its order; this way both reads are
    # ranges of the (status, finished_at) index (bench/status_history.py).
    in_flight = Page.objects.filter(status__in=[Page.Status.PENDING, Page.Status.RUNNING]).aggregate(
        **{f"waiting_{pk}": Count("id", filter=Q(pool_id=pk) & (Q(status=Page.Status.PENDING)
                                                                | Q(claim_expires_at__lt=now)))
           for pk in pool_ids},
        **{f"running_{pk}": Count("id", filter=Q(pool_id=pk, status=Page.Status.RUNNING, claim_expires_at__gte=now))
           for pk in pool_ids},
    )  # fmt: skip
    done = Page.objects.filter(status=Page.Status.DONE, finished_at__gte=done_since).aggregate(
        **{f"done_{pk}": Count("id", filter=Q(pool_id=pk)) for pk in pool_ids}
    )
    return {
        pk: {"waiting": in_flight[f"waiting_{pk}"], "running": in_flight[f"running_{pk}"], "done": done[f"done_{pk}"]}
        for pk in pool_ids
    }


def _pages_of_job(*conditions: Q, **filters) -> Coalesce:
    """How many of the outer job's pages match: a range of the (job, status) index."""
    pages = Page.objects.filter(*conditions, job=OuterRef("pk"), **filters).order_by().values("job")
    return Coalesce(Subquery(pages.annotate(n=Count("id")).values("n")), 0)


def pools_page_totals(*, now: datetime) -> dict[int, dict[str, int]]:
    """{pool id: {"done", "failed", "waiting", "running"}}: the metrics' counters and gauges.

    Bounded by the work in hand, not by history (it counted every page ever made): done and
    failed are the pools' tallies, maintained as jobs finish, plus what the unfinished jobs'
    pages did since they were last tallied; waiting and running are the unfinished jobs' pages
    (a finished job has none). Two queries whatever the history. A page runs while it is out at a
    pod: one a dispatcher claimed ahead for a lane (no pod yet) waits, as the dashboard's lanes and
    the job page count it (``ocrjobs.models.page_status_filters``)."""
    totals: dict[int, dict[str, int]] = defaultdict(lambda: {"done": 0, "failed": 0, "waiting": 0, "running": 0})
    for pool_id, done, failed in PoolPageTally.objects.values_list("pool_id", "done", "failed"):
        totals[pool_id]["done"] += done
        totals[pool_id]["failed"] += failed
    live_claim = Q(status=Page.Status.RUNNING, claim_expires_at__gte=now)
    out_at_a_pod = live_claim & Q(pod__isnull=False)
    unfinished = (
        Job.objects.exclude(status__in=Job.FINISHED)
        .order_by()
        .values("pool_id")
        .annotate(
            done=Sum(_pages_of_job(status=Page.Status.DONE) - F("tallied_done")),
            failed=Sum(_pages_of_job(status=Page.Status.FAILED) - F("tallied_failed")),
            # as in the status endpoint: a running page whose claim expired waits again
            waiting=Sum(_pages_of_job(Q(status=Page.Status.PENDING)
                                      | Q(status=Page.Status.RUNNING, claim_expires_at__lt=now)
                                      | (live_claim & Q(pod__isnull=True)))),
            running=Sum(_pages_of_job(out_at_a_pod)),
        )
    )  # fmt: skip
    for row in unfinished:
        for name in ("done", "failed", "waiting", "running"):
            totals[row["pool_id"]][name] += row[name] or 0
    return dict(totals)


def dispatchers_live() -> list[tuple[int, str, str, int]]:
    """(pool id, note, host, pid) of every live dispatcher."""
    return list(Dispatcher.objects.live().values_list("pool_id", "note", "host", "pid"))
