"""The order in which pages are claimed (ocrjobs/models.py ``claim_order``): pages whose claims
expired first, then pending pages a job at a time, each job's documents in strips of
CLAIM_STRIP_PAGES page numbers; read in that order through page_claim_order_idx, never by sorting
every pending page at each claim."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from bench._plans import _nodes, explain, statements
from ocrjobs.models import CLAIM_STRIP_PAGES, Document, Job, Page
from ocrjobs.services.pages import pages_claim
from pods.models import Pool


def job_of(pool: Pool, lengths: list[int], **fields) -> list[Document]:
    job = Job.objects.create(pool=pool, **fields)
    made = []
    for position, length in enumerate(lengths):
        document = Document.objects.create(job=job, position=position, name=f"{position}.pdf", kind="pdf",
                                           source=f"{job.pk}-{position}.pdf", size_bytes=1, page_count=length)  # fmt: skip
        Page.objects.bulk_create([Page(job=job, document=document, pool=pool, number=n) for n in range(1, length + 1)])
        made.append(document)
    return made


def named(claimed) -> list[tuple[int, int]]:
    return [(page.document_id, page.number) for page in claimed]


def test_pages_are_claimed_a_job_at_a_time_in_strips_of_its_documents_after_those_whose_claims_expired(db):
    assert CLAIM_STRIP_PAGES == 16  # (the figures below)
    pool = Pool.objects.create(key="order", provider="local")
    first, second, short = job_of(pool, [40, 40, 5])
    (later,) = job_of(pool, [3])
    (cancelled,) = job_of(pool, [2], status=Job.Status.CANCELLED)
    lost = later.pages.get(number=2)  # its dispatcher stopped renewing its claim
    Page.objects.filter(pk=lost.pk).update(status=Page.Status.RUNNING, claim_token="gone", attempts=1,
                                           claim_expires_at=timezone.now() - timedelta(seconds=5))  # fmt: skip

    head = pages_claim(pool_id=pool.pk, token="A", limit=1 + CLAIM_STRIP_PAGES)
    rest = pages_claim(pool_id=pool.pk, token="A", limit=500)

    def strip(document: Document, numbers: range) -> list[tuple[int, int]]:
        return [(document.pk, n) for n in numbers]

    assert named(head) == [(later.pk, 2), *strip(first, range(1, 17))]
    assert named(rest) == [
        *strip(second, range(1, 17)), *strip(short, range(1, 6)),
        *strip(first, range(17, 33)), *strip(second, range(17, 33)),
        *strip(first, range(33, 41)), *strip(second, range(33, 41)),
        (later.pk, 1), (later.pk, 3),
    ]  # fmt: skip
    assert not cancelled.pages.exclude(status=Page.Status.PENDING).exists()


@pytest.fixture
def backlog(db) -> Pool:
    """A pool's history of done pages and a backlog of pending ones, the statistics taken."""
    pool = Pool.objects.create(key="backlog", provider="local")
    job_of(pool, [2500, 2500], status=Job.Status.DONE)
    Page.objects.filter(pool=pool).update(status=Page.Status.DONE)
    job_of(pool, [2500, 2500])
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    return pool


def test_pending_pages_are_read_in_claim_order_through_its_index_without_a_sort(backlog):
    sent = statements(connection, lambda: pages_claim(pool_id=backlog.pk, token="A", limit=64))
    (sql, params), *_ = [(sql, params) for sql, params in sent if "ORDER BY" in sql and "pending" in params]

    plan = explain(connection, sql, params)

    if connection.vendor == "postgresql":
        nodes = list(_nodes(plan))
        assert any(node.get("Index Name") == "page_claim_order_idx" for node in nodes), nodes
        assert not [node for node in nodes if node["Node Type"] in ("Sort", "Incremental Sort")], nodes
    else:
        assert any("page_claim_order_idx" in step for step in plan), plan
        assert not [step for step in plan if "TEMP B-TREE" in step], plan
