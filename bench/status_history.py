"""Status with a long history: what `/v1/runpod/status` and the dashboard cost to compute
when the database holds hundreds of thousands of pages done over the past week.

    .venv/bin/python bench/status_history.py [--pages 300000] [--database-url postgres://...]

Computes the status (pods.selectors.fleet_status) and the dashboard's data
(pods.dashboard.fleet_snapshot) many times, first with the index on Page
(status, finished_at), then again without it, and prints the milliseconds
of each, ending with one JSON line. Goal: the cost follows the last minute's
pages, not every page ever done.
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

    from ocrjobs.models import Document, Job, Page
    from pods.models import Pool

    owner = get_user_model().objects.create_user("bench")
    pool = Pool.objects.create(key="gpu", name="GPU", provider="runpod", max_pods=8, lanes_per_pod=4)
    job = Job.objects.create(owner=owner, pool=pool, status=Job.Status.DONE)
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


def timed(func, repeats: int) -> dict:
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        func()
        samples.append((time.perf_counter() - started) * 1000)
    samples.sort()
    return {"median_ms": round(statistics.median(samples), 2), "max_ms": round(samples[-1], 2)}


def measure(repeats: int) -> dict:
    from django.utils import timezone

    from pods import dashboard
    from pods.selectors import fleet_status

    return {
        "status": timed(fleet_status, repeats),
        "dashboard": timed(lambda: dashboard.fleet_snapshot(now=timezone.now()), repeats),
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
        print(f"{name:>15}: status median {figures['status']['median_ms']} ms (max {figures['status']['max_ms']}), "
              f"dashboard median {figures['dashboard']['median_ms']} ms (max {figures['dashboard']['max_ms']})")  # fmt: skip
    print(json.dumps({"bench": "status_history", "database": connection.vendor, "pages": args.pages,
                      "recent": args.recent, "with_index": with_index, "without_index": without_index}))  # fmt: skip


if __name__ == "__main__":
    main()
