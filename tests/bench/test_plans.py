"""bench/_plans.py, the check bench/status_history.py and bench/dashboard_reads.py make of each
statement's plan, on real plans of this database: a read of the whole page table is caught, a
read through an index's condition passes."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.db.models import Count
from django.utils import timezone

from bench._plans import explain, history_readers, history_reads
from ocrjobs.models import Document, Job, Page
from pods.models import Pool

PAGES = 5000  # enough that PostgreSQL's planner prefers an index where one serves


@pytest.fixture
def history(db):
    pool = Pool.objects.create(key="plans", provider="local")
    job = Job.objects.create(pool=pool, status=Job.Status.DONE)
    document = Document.objects.create(job=job, position=0, name="d.pdf", kind="pdf", source="d.pdf", size_bytes=1,
                                       page_count=PAGES)  # fmt: skip
    now = timezone.now()
    Page.objects.bulk_create([Page(job=job, document=document, pool=pool, number=n, status=Page.Status.DONE,
                                   finished_at=now - timedelta(seconds=(PAGES - n) * 100), seconds=float(n % 7))
                              for n in range(1, PAGES + 1)])  # fmt: skip
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    return now


def steps_of(queryset) -> list[str]:
    sql, params = queryset.query.sql_with_params()
    return history_reads(connection.vendor, sql, explain(connection, sql, params))


def test_a_count_over_every_page_is_caught(history):
    assert steps_of(Page.objects.values("pool_id").annotate(n=Count("id")))


def test_the_last_minutes_pages_through_the_status_index_pass(history):
    recent = Page.objects.filter(status=Page.Status.DONE, finished_at__gte=history - timedelta(minutes=1))

    assert steps_of(recent.values("pool_id").annotate(n=Count("id"))) == []


@pytest.mark.skipif(
    connection.vendor == "sqlite",
    reason="SQLite then searches page_claim_idx by status alone, a SEARCH: see bench/_plans.py's limit",
)
def test_the_same_read_is_caught_once_its_index_is_gone(history):
    with connection.cursor() as cursor:
        cursor.execute("DROP INDEX page_status_finished_idx")  # (the test's transaction puts it back)
        cursor.execute("ANALYZE")
    recent = Page.objects.filter(status=Page.Status.DONE, finished_at__gte=history - timedelta(minutes=1))

    assert steps_of(recent.values("pool_id").annotate(n=Count("id")))


def test_a_scan_of_the_page_table_under_an_alias_is_caught(history):
    # Django names the table U0 in a subquery; SQLite's plan then says "SCAN U0".
    slow = Page.objects.filter(seconds__gt=5).values("job_id")
    queryset = Job.objects.filter(pk__in=slow)

    assert "U0" in str(queryset.query)
    assert steps_of(queryset)


def test_reading_the_pages_in_the_order_of_an_index_without_its_condition_is_caught(history):
    assert steps_of(Page.objects.order_by("pk").values("pk")[:10])


def test_it_names_only_the_statements_that_read_the_whole_table(history):
    found = history_readers(
        connection,
        lambda: (
            Page.objects.filter(status=Page.Status.DONE, finished_at__gte=history - timedelta(minutes=1)).count(),
            Page.objects.filter(seconds__gt=5).count(),
        ),
    )

    assert len(found) == 1 and '"seconds" >' in found[0]["sql"], found
