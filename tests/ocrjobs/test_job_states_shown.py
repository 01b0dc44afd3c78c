"""Issue 42: a job page's progress and actions fit its state. Done, failed and cancelled pages
are segments of their own (a cancelled job with nothing read shows no done bar); a failed
document is said in words; a job with nothing read offers no downloads or rebuild; documents
say "done" when read; "1 attempt". (The searchable PDF's <name>.ocr.pdf: tests/ocrjobs/test_outputs.py.)"""

from __future__ import annotations

import re

import pytest

from ocrjobs.models import Document, Job
from ocrjobs.selectors import JobProgress, document_state, job_progress, jobs_for_dashboard
from ocrjobs.services.jobs import job_refresh
from tests.factories import PAGES_TRUTH, image_bytes, pdf_bytes
from tests.helpers import page_text
from tests.ocrjobs.helpers import complete_all, split, submit

pytestmark = pytest.mark.usefixtures("local_pool")


def progress(**counts) -> JobProgress:
    base = {"done": 0, "failed": 0, "cancelled": 0, "running": 0, "pending": 0}
    return JobProgress(job=Job(), expected=counts.pop("expected"), pages_per_s=0, **(base | counts))


@pytest.mark.parametrize(
    ("counts", "segments"),
    [
        ({"expected": 17, "cancelled": 17}, {"done": 0, "failed": 0, "cancelled": 100}),
        ({"expected": 4, "done": 2, "failed": 1, "cancelled": 1}, {"done": 50, "failed": 25, "cancelled": 25}),
        ({"expected": 3, "done": 1, "failed": 1, "cancelled": 1}, {"done": 33, "failed": 33, "cancelled": 33}),
        ({"expected": 3, "done": 3}, {"done": 100, "failed": 0, "cancelled": 0}),
        ({"expected": 0}, {"done": 0, "failed": 0, "cancelled": 0}),
        ({"expected": 2, "done": 2, "failed": 1}, {"done": 100, "failed": 0, "cancelled": 0}),  # never past 100
    ],
)
def test_the_bar_has_a_segment_for_done_failed_and_cancelled_pages(counts, segments):
    assert progress(**counts).segments == segments


@pytest.mark.parametrize(
    ("status", "pages", "state"),
    [
        ("pending", {}, "splitting"),
        ("failed", {}, "failed"),
        ("split", {"done": 2}, "done"),
        ("split", {"done": 1, "running": 1}, "reading"),
        ("split", {"done": 1, "failed": 1}, "partial"),
        ("split", {"cancelled": 2}, "cancelled"),
        ("split", {"failed": 2}, "failed"),
    ],
)
def test_a_document_says_done_not_split_once_every_page_is_read(status, pages, state):
    assert document_state(Document(status=status, page_count=2), pages) == state


def bar(html: str) -> dict[str, str]:
    """{segment: its data-width} of the job page's progress bar."""
    section = re.search(r'<section id="job-progress".*?</section>', html, re.S).group(0)
    return dict(re.findall(r'class="seg seg-(\w+)" data-width="(\d+)"', section))


def test_a_cancelled_job_with_nothing_read_shows_no_done_bar_and_offers_no_downloads(bob, ordinary_user):
    job = submit(ordinary_user, {"report.pdf": pdf_bytes(PAGES_TRUTH[:2])}, searchable_pdf=True)
    split(job)
    bob.post(f"/jobs/{job.pk}/cancel")

    html = bob.get(f"/jobs/{job.pk}").content.decode()

    assert bar(html) == {"done": "0", "cancelled": "100"}
    assert "0 of 2 pages done" in page_text_of(html) and "2 cancelled" in page_text_of(html)
    assert "result.txt" not in html and "outputs.zip" not in html and "searchable PDFs" not in html
    assert "Nothing to download: no page was read." in html
    assert re.search(r'class="status-cancelled">cancelled</td>', html)


def page_text_of(html: str) -> str:
    return re.sub(r"<[^>]+>", "", html)


def test_a_partial_job_says_its_failed_document_in_words_and_its_done_ones_say_done(bob, ordinary_user):
    job = submit(ordinary_user, {"a.png": image_bytes(["one"]), "b.png": image_bytes(["two"])})
    split(job)
    Document.objects.filter(job=job, name="b.png").update(
        status=Document.Status.FAILED, error="unreadable", page_count=0
    )
    job.pages.filter(document__name="b.png").delete()
    complete_all(job)
    job_refresh(job_id=job.pk)

    response = bob.get(f"/jobs/{job.pk}")
    text = page_text(response)

    assert "1 of 1 pages done" in page_text_of(text) and "1 document failed" in text
    assert bar(response.content.decode())["done"] == "100"
    assert re.search(r"<td>a.png</td>.*?class=\"status-done\">done</td>", text, re.S)
    assert ">split<" not in text
    assert "1 attempt ·" in text and "1 attempts" not in text
    assert "result.txt" in text  # something was read: its downloads are offered


def test_the_dashboard_row_says_a_failed_document_in_words_without_a_query_of_its_own(ordinary_user):
    job = submit(ordinary_user, {"a.png": image_bytes(["one"]), "b.png": image_bytes(["two"])})
    Document.objects.filter(job=job, name="b.png").update(status=Document.Status.FAILED)
    [row] = job_progress(jobs_for_dashboard(owner_ids=[ordinary_user.pk]))

    assert row.failed_documents == 1
    assert job_progress([Job.objects.get(pk=job.pk)])[0].failed_documents == 1  # read when not carried
