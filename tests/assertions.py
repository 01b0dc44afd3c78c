"""Assertions that several test modules make the same way."""

from __future__ import annotations

from collections import Counter

from django.conf import settings

from ocrjobs.models import Job, Page


def assert_every_page_done_once(job: Job, *, pages: int | None = None, job_done: bool = True) -> None:
    """Every page of ``job`` is done, once: no page lost, none written twice.

    - the job has ``pages`` pages (default: as many as its documents counted, at least one), all done;
    - each document's ``results/`` folder (MEDIA_ROOT/jobs/<job>/<position>/results/) holds exactly one
      result file per page and no other, and the file each page's row names exists;
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
    for position in set(job.documents.values_list("position", flat=True)):
        results = (settings.MEDIA_ROOT / "jobs" / str(job.pk) / str(position) / "results").glob("*.json")
        written = Counter(int(path.name.split("-")[0]) for path in results)
        wanted = {p.pk: 1 for p in rows if p.document.position == position}
        assert written == wanted, f"document {position}: result files per page {dict(written)}"
    for page in rows:
        assert (settings.MEDIA_ROOT / page.result).is_file(), f"page {page.pk}: no file {page.result}"
