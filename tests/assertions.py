"""Assertions that several test modules make the same way."""

from __future__ import annotations

import json
from collections import Counter

from ocrjobs.models import Job, Page


def assert_every_page_done_once(job: Job, *, pages: int | None = None, job_done: bool = True) -> None:
    """Every page of ``job`` is done, once: no page lost, none written twice.

    - the job has ``pages`` pages (default: as many as its documents counted, at least one), all done;
    - every page holds its one result in its row (pages_complete writes it only under the claim
      that is still current, so a second writer is refused; there are no result files to count);
    - the job itself is done, unless ``job_done=False`` (pages stored without a split document: nothing
      finishes the job).
    """
    job.refresh_from_db()
    rows = list(job.pages.select_related("document"))
    expected = sum(job.documents.values_list("page_count", flat=True)) if pages is None else pages
    assert len(rows) == expected > 0, f"{len(rows)} pages, {expected} expected"
    assert Counter(p.status for p in rows) == {Page.Status.DONE: expected}, [(p.pk, p.status, p.error) for p in rows]
    if job_done:
        assert job.status == Job.Status.DONE, job.status
    for page in rows:
        assert page.result, f"page {page.pk}: done without a result"
        result = json.loads(page.result)
        assert isinstance(result, dict) and "text" in result, f"page {page.pk}: not a result: {page.result[:200]}"
