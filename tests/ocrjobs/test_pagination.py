"""Cursor pagination: GET /v1/jobs and GET /v1/jobs/{id}/pages walk everything by their `next`
links, a page at a time; the job's page shows one batch of pages and reads only those."""

from __future__ import annotations

import pytest

from accounts.models import ApiToken
from ocrjobs.models import Job, Page
from ocrjobs.results import StoredResult
from tests.factories import pdf_bytes
from tests.helpers import auth
from tests.ocrjobs.helpers import complete_all, split, submit, tiff_bytes
from tests.ocrjobs.test_submit_api import assert_refused


def walk(client, token: str, url: str, key: str) -> list[list[dict]]:
    """Every page of a listing, following `next` until it is null."""
    pages = []
    while url is not None:
        response = client.get(url, headers=auth(token))
        assert response.status_code == 200, response.content
        pages.append(response.json()[key])
        url = response.json()["next"]
        assert len(pages) < 100, "the next links never end"
    return pages


@pytest.fixture
def seven_jobs(ordinary_user, local_pool) -> list[Job]:
    return [Job.objects.create(owner=ordinary_user, pool=local_pool) for _ in range(7)]


@pytest.fixture
def long_job(ordinary_user, local_pool) -> Job:
    """One 60-frame TIFF, split and every page done."""
    job = submit(ordinary_user, {"scan.tif": tiff_bytes([(60, 40)] * 60)})
    split(job)
    complete_all(job)
    assert job.pages.filter(status=Page.Status.DONE).count() == 60
    return job


def test_the_job_list_walks_every_job_newest_first_by_its_next_links(client, submit_token, seven_jobs):
    pages = walk(client, submit_token, "/v1/jobs?limit=3", "jobs")

    assert [len(page) for page in pages] == [3, 3, 1]
    ids = [job["id"] for page in pages for job in page]
    assert ids == sorted((job.pk for job in seven_jobs), reverse=True)


def test_a_job_submitted_while_walking_neither_repeats_nor_skips_older_jobs(
    client, submit_token, seven_jobs, ordinary_user, local_pool
):
    first = client.get("/v1/jobs?limit=4", headers=auth(submit_token)).json()
    Job.objects.create(owner=ordinary_user, pool=local_pool)
    rest = walk(client, submit_token, first["next"], "jobs")

    ids = [job["id"] for job in first["jobs"]] + [job["id"] for page in rest for job in page]
    assert ids == sorted((job.pk for job in seven_jobs), reverse=True)


def test_the_job_list_has_no_next_link_when_everything_fits(client, submit_token, seven_jobs):
    body = client.get("/v1/jobs", headers=auth(submit_token)).json()

    assert len(body["jobs"]) == 7
    assert body["next"] is None


def test_the_job_list_pages_only_the_callers_jobs(client, admin_token, submit_token, seven_jobs, admin_user):
    Job.objects.create(owner=admin_user, pool=seven_jobs[0].pool)

    mine = [job["id"] for page in walk(client, submit_token, "/v1/jobs?limit=2", "jobs") for job in page]
    everyone = [job["id"] for page in walk(client, admin_token, "/v1/jobs?limit=2", "jobs") for job in page]

    assert len(mine) == 7
    assert len(everyone) == 8


@pytest.mark.parametrize(
    "query, words",
    [
        ("limit=0", ["limit"]),
        ("limit=201", ["limit", "200"]),
        ("limit=ten", ["limit"]),
        ("limit=-1", ["limit"]),
        ("cursor=not-a-cursor", ["cursor"]),
        ("cursor=eyJhZnRlciI6ICJ4In0", ["cursor"]),  # {"after": "x"}
        ("offset=10", ["unknown query parameter", "offset"]),
    ],
)
def test_a_bad_cursor_or_limit_is_a_400(client, submit_token, seven_jobs, query, words):
    assert_refused(client.get(f"/v1/jobs?{query}", headers=auth(submit_token)), 400, *words)
    assert_refused(client.get(f"/v1/jobs/{seven_jobs[0].pk}/pages?{query}", headers=auth(submit_token)), 400, *words)


def test_a_jobs_pages_walk_every_page_once_in_order_with_its_text(client, submit_token, long_job):
    pages = walk(client, submit_token, f"/v1/jobs/{long_job.pk}/pages?limit=25", "pages")

    assert [len(page) for page in pages] == [25, 25, 10]
    records = [record for page in pages for record in page]
    assert [record["page"] for record in records] == list(range(1, 61))
    assert {record["status"] for record in records} == {"done"}
    assert records[41]["text"] == "document 0 page 42\n"


def test_a_page_of_a_jobs_pages_reads_only_the_results_it_answers(client, submit_token, long_job, monkeypatch):
    built = []
    real = Page.to_record
    monkeypatch.setattr(Page, "to_record", lambda page: built.append(page.pk) or real(page))

    response = client.get(f"/v1/jobs/{long_job.pk}/pages?limit=10", headers=auth(submit_token))

    assert [record["id"] for record in response.json()["pages"]] == built
    assert len(built) == 10


def test_another_users_job_pages_are_not_found(client, outsider, long_job):
    token = ApiToken.issue(user=outsider, name="test", scopes=["read"])[1]

    assert_refused(client.get(f"/v1/jobs/{long_job.pk}/pages", headers=auth(token)), 404, "no job")


def test_the_job_page_shows_one_batch_of_pages_and_reads_only_their_results(client, ordinary_user, long_job,
                                                                           monkeypatch):  # fmt: skip
    read = []
    real = StoredResult.from_row
    monkeypatch.setattr(StoredResult, "from_row", lambda page: read.append(page.number) or real(page))
    client.force_login(ordinary_user)

    first = client.get(f"/jobs/{long_job.pk}").content.decode()
    first_read, read[:] = list(read), []
    last = client.get(f"/jobs/{long_job.pk}/viewer?offset=50").content.decode()

    assert first_read == list(range(1, 26))
    assert read == list(range(51, 61))
    assert "All pages (60)" in first and "viewer?offset=25" in first
    assert "document 0 page 25" in first and "document 0 page 26" not in first
    assert "document 0 page 60" in last and "viewer?offset" not in last


def test_the_job_page_of_a_job_not_split_yet_says_so(client, ordinary_user, local_pool):
    job = submit(ordinary_user, {"a.pdf": pdf_bytes()})
    client.force_login(ordinary_user)

    assert "No pages yet" in client.get(f"/jobs/{job.pk}").content.decode()
