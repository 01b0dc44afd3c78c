"""pages_complete reads nothing before it stores pages that take no part in a cascade: one guarded
UPDATE per batch (a read of every batch's pages and pools cost the dispatcher a fifth of its pages
a second, bench/dispatch.py). Pages in a cascade still go the cascade's way."""

from __future__ import annotations

import uuid

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from ocrjobs.models import Page
from ocrjobs.services.pages import PageResult, pages_claim, pages_complete
from pods.models import Pool
from podserver.answers import PageAnswer
from tests.factories import image_bytes
from tests.ocrjobs.helpers import split, submit


def _claimed(owner, pool: Pool, pages: int) -> tuple[str, list[PageResult]]:
    job = submit(owner, {f"p{n}.png": image_bytes([f"page {n}"]) for n in range(pages)}, pool_key=pool.key)
    split(job)
    token = uuid.uuid4().hex
    claimed = pages_claim(pool_id=pool.pk, token=token, limit=100)
    assert len(claimed) == pages
    reading = {"text": "a page", "lines": [], "confidence": 0.2, "engine": "tesseract", "seconds": 0.5}
    return token, [PageResult(c.id, c.job_id, c.position, None, PageAnswer(**reading), seconds=0.5) for c in claimed]


@pytest.fixture
def pools(db):
    strong = Pool.objects.create(key="strong", provider="local", max_pods=1)
    cheap = Pool.objects.create(key="cheap", provider="local", max_pods=1, escalation_pool=strong,
                                escalation_threshold=0.5)  # fmt: skip
    plain = Pool.objects.create(key="plain", provider="local", max_pods=1)
    return plain, cheap, strong


def test_a_batch_in_no_cascade_is_stored_by_one_statement(pools, ordinary_user):
    plain, _, strong = pools
    for pool in (plain, strong):  # strong is an escalation pool, but these pages never escalated
        token, items = _claimed(ordinary_user, pool, pages=5)
        with CaptureQueriesContext(connection) as queries:
            stored = pages_complete(token=token, items=items)
        # One statement asks anything of pages (on PostgreSQL, the planner's setting and its
        # transaction go with it: fleetadmin/sqlbatch.py joined_by_hash).
        asked = [query["sql"] for query in queries.captured_queries if "ocrjobs_page" in query["sql"]]
        assert len(asked) == 1 and asked[0].startswith("WITH v("), asked
        assert stored == {item.page_id for item in items}
        assert set(Page.objects.filter(pk__in=stored).values_list("status", flat=True)) == {Page.Status.DONE}


def test_a_batch_in_a_pool_that_escalates_still_escalates(pools, ordinary_user):
    _, cheap, strong = pools
    token, items = _claimed(ordinary_user, cheap, pages=3)  # confidence 0.2, below the threshold 0.5
    assert pages_complete(token=token, items=items) == {item.page_id for item in items}
    moved = Page.objects.filter(pk__in=[item.page_id for item in items])
    assert set(moved.values_list("status", "pool_id", "escalated_from_id")) == {(Page.Status.PENDING, strong.pk,
                                                                                  cheap.pk)}  # fmt: skip
    # their second reading, in the escalation pool, carries both stages
    token = uuid.uuid4().hex
    claimed = pages_claim(pool_id=strong.pk, token=token, limit=100)
    second = {"text": "a page", "lines": [], "confidence": 0.9, "engine": "rapidocr", "seconds": 1.0}
    items = [PageResult(c.id, c.job_id, c.position, None, PageAnswer(**second), seconds=1.0) for c in claimed]
    assert len(pages_complete(token=token, items=items)) == 3
    result = Page.objects.get(pk=items[0].page_id).read_result()
    assert result["escalated"] is True
    assert [stage["engine"] for stage in result["cascade"]] == ["tesseract", "rapidocr"]


def test_a_lost_claim_is_not_stored_by_either_way(pools, ordinary_user):
    plain, cheap, _ = pools
    for pool in (plain, cheap):
        _, items = _claimed(ordinary_user, pool, pages=2)
        assert pages_complete(token="not-the-claim", items=items) == set()
        assert set(Page.objects.filter(pk__in=[i.page_id for i in items]).values_list("status", flat=True)) == {
            Page.Status.RUNNING}  # fmt: skip
