"""Status with a long history: what `/v1/runpod/status` and the dashboard cost to compute
when the database holds hundreds of thousands of pages done over the past week.

    .venv/bin/python bench/status_history.py [--pages 300000] [--database-url postgres://...]

Computes the status (pods.selectors.fleet_status), the dashboard's data
(pods.dashboard.fleet_snapshot), a /metrics scrape (its collector) and the
job page of the job that holds the history (one screen of its pages) many
times, first with the index on Page (status, finished_at), then again without
it, and prints the milliseconds of each, ending with one JSON line. For
contrast it also times the page counts /metrics used to make over every page
ever made. Goal: the cost follows the last minute's pages and the work in
hand, not every page ever done.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench._setup import django_for_bench

INDEX = "page_status_finished_idx"


def populate(pages: int, recent: int) -> None:
    from datetime import timedelta

    from django.contrib.auth import get_user_model
    from django.utils import timezone

    from ocrjobs.models import Document, Job, Page, PoolPageTally
    from pods.models import Pool

    owner = get_user_model().objects.create_user("bench")
    pool = Pool.objects.create(key="gpu", name="GPU", provider="runpod", max_pods=8, lanes_per_pod=4)
    job = Job.objects.create(owner=owner, pool=pool, status=Job.Status.DONE, tallied_done=pages)
    PoolPageTally.objects.create(pool=pool, done=pages)  # as the job's finish would have left it
    document = Document.objects.create(job=job, position=0, name="history.pdf", kind="pdf", source="history.pdf",
                                       size_bytes=1, page_count=pages)  # fmt: skip
    now = timezone.now()
    week = 7 * 24 * 3600
    batch = []
    for number in range(1, pages + 1):
        # the last `recent` pages finished within the last minute; the rest over the week before
        age = (pages - number) * 50.0 / recent if number > pages - recent else 60 + (pages - number) * week / pages
        batch.append(Page(job=job, document=document, pool=pool, number=number,
                          status=Page.Status.DONE, started_at=now - timedelta(seconds=age + 2),
                          finished_at=now - timedelta(seconds=age)))  # fmt: skip
        if len(batch) == 10_000:
            Page.objects.bulk_create(batch)
            batch = []
    Page.objects.bulk_create(batch)
    # Today's job beside the history: 60 pages, done in the last minute.
    today = Job.objects.create(owner=owner, pool=pool, status=Job.Status.DONE, tallied_done=60)
    document = Document.objects.create(job=today, position=0, name="today.pdf", kind="pdf", source="today.pdf",
                                       size_bytes=1, page_count=60)  # fmt: skip
    Page.objects.bulk_create([Page(job=today, document=document, pool=pool, number=n,
                                   status=Page.Status.DONE, started_at=now - timedelta(seconds=5),
                                   finished_at=now - timedelta(seconds=3)) for n in range(1, 61)])  # fmt: skip
    PoolPageTally.objects.filter(pool=pool).update(done=pages + 60)


def timed(func, repeats: int) -> dict:
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        func()
        samples.append((time.perf_counter() - started) * 1000)
    samples.sort()
    return {"median_ms": round(statistics.median(samples), 2), "max_ms": round(samples[-1], 2)}


def _scrape() -> bytes:
    from prometheus_client import CollectorRegistry, generate_latest

    from fleetadmin.metrics import FleetCollector

    registry = CollectorRegistry(auto_describe=False)
    registry.register(FleetCollector())
    return generate_latest(registry)


def _job_page(*, history: bool) -> None:
    """The job page of today's 60-page job (``history``: of the job that holds the history)."""
    from django.contrib.auth import get_user_model
    from django.test import RequestFactory

    from ocrjobs.models import Job
    from ocrjobs.views import job_detail

    request = RequestFactory().get("/jobs/1")
    request.user = get_user_model().objects.get(username="bench")
    job = Job.objects.order_by("pk" if history else "-pk").first()
    response = job_detail(request, job.pk)
    assert response.status_code == 200


def _counts_over_history() -> None:
    """What /metrics counted before it kept tallies: every page ever made, by pool and status."""
    from django.db.models import Count, Q

    from ocrjobs.models import Page

    list(Page.objects.values("pool_id").annotate(done=Count("id", filter=Q(status="done")),
                                                 failed=Count("id", filter=Q(status="failed"))))  # fmt: skip


def measure(repeats: int) -> dict:
    from django.utils import timezone

    from pods import dashboard
    from pods.selectors import fleet_status

    return {
        "status": timed(fleet_status, repeats),
        "dashboard": timed(lambda: dashboard.fleet_snapshot(now=timezone.now()), repeats),
        "metrics": timed(_scrape, repeats),
        "job_page": timed(lambda: _job_page(history=False), repeats),
        "job_page_of_the_history_job": timed(lambda: _job_page(history=True), max(3, repeats // 10)),
        "old_metrics_page_counts": timed(_counts_over_history, max(3, repeats // 10)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pages", type=int, default=300_000, help="pages done over the past week")
    parser.add_argument("--recent", type=int, default=600, help="of which done in the last minute")
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--database-url", default=os.environ.get("DATABASE_URL", ""))
    args = parser.parse_args()
    django_for_bench("status-history", database_url=args.database_url)
    from django.db import connection

    started = time.perf_counter()
    populate(args.pages, args.recent)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    print(f"{args.pages} pages written in {time.perf_counter() - started:.1f} s ({connection.vendor})")

    with_index = measure(args.repeats)
    with connection.cursor() as cursor:
        cursor.execute(f"DROP INDEX IF EXISTS {INDEX}")
        cursor.execute("ANALYZE")
    without_index = measure(args.repeats)

    for name, figures in (("with the index", with_index), ("without it", without_index)):
        shown = ", ".join(f"{what} median {f['median_ms']} ms (max {f['max_ms']})" for what, f in figures.items())
        print(f"{name:>15}: {shown}")
    print(json.dumps({"bench": "status_history", "database": connection.vendor, "pages": args.pages,
                      "recent": args.recent, "with_index": with_index, "without_index": without_index}))  # fmt: skip


if __name__ == "__main__":
    main()
