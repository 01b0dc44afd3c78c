"""Issue 42's job list: names, pages, progress, cost and owner; search by document name; filters by
status, pool, owner (staff) and date; pages that say how many jobs match. A page is read in the
same few queries however many jobs and documents there are."""

from __future__ import annotations

import datetime as dt
import re

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from ocrjobs.models import Job
from ocrjobs.views import JOBS_PER_PAGE
from tests.factories import image_bytes
from tests.helpers import page_text
from tests.ocrjobs.helpers import complete_all, split, submit

pytestmark = pytest.mark.usefixtures("local_pool")

PNG = image_bytes(["x"])


def shown(response) -> list[int]:
    """The ids of the jobs a list page shows, in order."""
    return [int(pk) for pk in re.findall(r'<tr id="job-(\d+)"', response.content.decode())]


def test_a_row_names_the_documents_and_shows_progress_pages_cost_and_owner(client, admin_user, ordinary_user):
    job = submit(ordinary_user, {f"scan-{i}.png": PNG for i in range(5)})
    split(job)
    complete_all(job)
    client.force_login(admin_user)

    text = page_text(client.get("/jobs/"))

    row = re.search(rf'<tr id="job-{job.pk}".*?</tr>', text, re.S).group(0)
    assert "scan-0.png, scan-1.png, scan-2.png" in row and "and 2 more" in row
    assert ">bob<" in row and ">local<" in row
    assert "5 / 5 pages done" in re.sub(r"<[^>]+>", "", row)
    assert 'class="seg seg-done" data-width="100"' in row
    # what it cost, as the dashboard counts it
    assert re.search(r'<td class="num" data-label="cost">\$[\d.]+</td>', row)


def test_the_list_pages_its_jobs_and_says_how_many_there_are(bob, ordinary_user):
    jobs = [submit(ordinary_user, {"a.png": PNG}) for _ in range(JOBS_PER_PAGE + 3)]
    newest_first = [job.pk for job in reversed(jobs)]

    first = bob.get("/jobs/")
    second = bob.get("/jobs/?page=2")

    assert shown(first) == newest_first[:JOBS_PER_PAGE]
    assert shown(second) == newest_first[JOBS_PER_PAGE:]
    assert f"Jobs 1–{JOBS_PER_PAGE} of {JOBS_PER_PAGE + 3}" in page_text(first)
    assert "page 1 of 2" in page_text(first) and 'rel="next"' in page_text(first)
    assert f"Jobs {JOBS_PER_PAGE + 1}–{JOBS_PER_PAGE + 3} of {JOBS_PER_PAGE + 3}" in page_text(second)


def test_search_by_document_name_and_the_filters_keep_to_their_jobs(client, admin_user, ordinary_user, outsider):
    invoice = submit(ordinary_user, {"Invoice-March.png": PNG})
    report = submit(ordinary_user, {"report.png": PNG})
    theirs = submit(outsider, {"invoice-april.png": PNG})
    split(report)
    complete_all(report)
    Job.objects.filter(pk=theirs.pk).update(created_at=timezone.now() - dt.timedelta(days=10))
    client.force_login(admin_user)
    today = timezone.localdate().isoformat()

    assert sorted(shown(client.get("/jobs/?q=invoice"))) == sorted([invoice.pk, theirs.pk])
    assert shown(client.get("/jobs/?status=done")) == [report.pk]
    assert shown(client.get("/jobs/?owner=mallory")) == [theirs.pk]
    assert shown(client.get("/jobs/?pool=local&q=invoice&owner=bob")) == [invoice.pk]
    assert sorted(shown(client.get(f"/jobs/?since={today}"))) == sorted([invoice.pk, report.pk])
    assert shown(client.get(f"/jobs/?until={timezone.localdate() - dt.timedelta(days=1)}")) == [theirs.pk]
    assert "No job matches." in page_text(client.get("/jobs/?q=nothing-like-it"))


def test_a_user_sees_only_their_jobs_and_has_no_owner_filter(bob, ordinary_user, outsider):
    mine = submit(ordinary_user, {"invoice.png": PNG})
    submit(outsider, {"invoice.png": PNG})

    response = bob.get("/jobs/?q=invoice&owner=mallory")  # the owner filter is not theirs: ignored

    assert shown(response) == [mine.pk]
    assert 'name="owner"' not in response.content.decode()


@pytest.mark.parametrize(
    ("query", "error"),
    [
        ("status=exploded", "Select a valid choice"),
        ("pool=nowhere", "Select a valid choice"),
        ("since=yesterday", "Enter a valid date"),
        ("since=2026-12-05&until=2026-12-01", "“From” is after “To”."),
    ],
)
def test_a_bad_filter_is_a_form_error_not_a_list(bob, ordinary_user, query, error):
    submit(ordinary_user, {"a.png": PNG})

    response = bob.get(f"/jobs/?{query}")

    assert response.status_code == 400
    assert error in page_text(response) and shown(response) == []


def test_a_page_of_the_list_reads_the_same_queries_however_many_jobs_and_documents(
    client, admin_user, ordinary_user, django_assert_max_num_queries
):
    def queries() -> int:
        with CaptureQueriesContext(connection) as context:
            assert client.get("/jobs/").status_code == 200
        return len(context.captured_queries)

    client.force_login(admin_user)
    job = submit(ordinary_user, {"a.png": PNG})
    split(job)
    complete_all(job)
    few = queries()
    for i in range(JOBS_PER_PAGE + 5):
        other = submit(admin_user if i % 2 else ordinary_user, {f"d{n}.png": PNG for n in range(4)})
        split(other)

    assert queries() == few <= 12  # session, user, pools, count, jobs, pages, names, spend…
    with django_assert_max_num_queries(few):  # filtered, the same reads
        client.get("/jobs/?q=d1&status=running")
