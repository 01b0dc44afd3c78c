"""GET /v1/jobs/{id}, its results, cancel and retry: who sees what, and what it says."""

from __future__ import annotations

import json

import pytest
from asgiref.sync import async_to_sync
from django.test import AsyncClient

from accounts.models import ApiToken
from ocrjobs import api
from ocrjobs.models import Job, Page
from ocrjobs.services.jobs import job_cancel
from tests.factories import PAGES_TRUTH, image_bytes, pdf_bytes
from tests.helpers import auth
from tests.ocrjobs.helpers import complete_all, result_for, split, submit


def body_of(response) -> str:
    return b"".join(response.streaming_content).decode()


@pytest.fixture
def own_job(ordinary_user, local_pool) -> Job:
    """bob's job: a two-page PDF and a PNG, in that order, not split yet."""
    return submit(ordinary_user, {"zeta.pdf": pdf_bytes(PAGES_TRUTH[:2]), "alpha.png": image_bytes(["x"])})


@pytest.fixture
def outsider_token(outsider) -> str:
    return ApiToken.issue(user=outsider, name="test", scopes=["submit"])[1]


# --- status -----------------------------------------------------------------------


def test_the_owner_gets_the_jobs_status_and_page_counts(client, submit_token, own_job):
    split(own_job)

    response = client.get(f"/v1/jobs/{own_job.pk}", headers=auth(submit_token))

    assert response.status_code == 200
    body = response.json()
    assert body["id"] == own_job.pk
    assert body["status"] == "running"
    assert body["pages"] == {"total": 3, "pending": 3, "running": 0, "done": 0, "failed": 0, "cancelled": 0,
                             "warnings": 0}  # fmt: skip
    assert [(d["name"], d["page_count"], d["status"]) for d in body["documents"]] == [
        ("zeta.pdf", 2, "split"),
        ("alpha.png", 1, "split"),
    ]
    assert body["urls"]["result_jsonl"] == f"/v1/jobs/{own_job.pk}/result.jsonl"


def test_a_read_token_can_read_its_users_job(client, read_token, own_job):
    response = client.get(f"/v1/jobs/{own_job.pk}", headers=auth(read_token))

    assert response.status_code == 200
    assert response.json()["id"] == own_job.pk


@pytest.mark.parametrize("suffix", ["", "/result.txt", "/result.jsonl"])
def test_another_users_job_is_not_found(client, outsider_token, own_job, suffix):
    response = client.get(f"/v1/jobs/{own_job.pk}{suffix}", headers=auth(outsider_token))

    assert response.status_code == 404
    assert response.json() == {"error": f"no job {own_job.pk}"}


def test_another_users_job_cannot_be_cancelled(client, outsider_token, own_job):
    response = client.post(f"/v1/jobs/{own_job.pk}/cancel", headers=auth(outsider_token))

    assert response.status_code == 404
    own_job.refresh_from_db()
    assert own_job.status == Job.Status.QUEUED


def test_another_users_job_is_not_listed(client, outsider_token, own_job):
    response = client.get("/v1/jobs", headers=auth(outsider_token))

    assert response.status_code == 200
    assert response.json() == {"jobs": [], "next": None}


def test_an_unknown_job_is_not_found(client, submit_token, own_job):
    response = client.get(f"/v1/jobs/{own_job.pk + 1000}", headers=auth(submit_token))

    assert response.status_code == 404
    assert response.json() == {"error": f"no job {own_job.pk + 1000}"}


def test_staff_see_every_users_jobs(client, admin_token, admin_user, own_job):
    by_token = client.get(f"/v1/jobs/{own_job.pk}", headers=auth(admin_token))
    listing = client.get("/v1/jobs", headers=auth(admin_token))
    client.force_login(admin_user)
    by_session = client.get(f"/v1/jobs/{own_job.pk}")

    assert by_token.status_code == 200
    assert [job["id"] for job in listing.json()["jobs"]] == [own_job.pk]
    assert by_session.status_code == 200


# --- results ------------------------------------------------------------------------


def test_result_txt_has_each_documents_pages_in_order(client, submit_token, own_job):
    split(own_job)
    complete_all(own_job, {(0, 1): "zeta first page", (0, 2): "zeta second page", (1, 1): "alpha only page"})

    response = client.get(f"/v1/jobs/{own_job.pk}/result.txt", headers=auth(submit_token))

    assert response.status_code == 200
    assert response["Content-Type"] == "text/plain; charset=utf-8"
    assert body_of(response) == (
        "==> zeta.pdf <==\nzeta first page\n\f\nzeta second page\n\f\n\n==> alpha.png <==\nalpha only page\n\f\n\n"
    )


def test_result_txt_marks_a_failed_page_with_its_error(client, submit_token, own_job):
    split(own_job)
    complete_all(own_job, failures={(0, 2): "the pod refused the page: unreadable"})

    text = body_of(client.get(f"/v1/jobs/{own_job.pk}/result.txt", headers=auth(submit_token)))

    assert "document 0 page 1\n" in text
    assert "[page 2: failed: the pod refused the page: unreadable]" in text
    assert "document 0 page 2" not in text


def test_result_jsonl_has_one_record_per_page_in_document_then_page_order(client, submit_token, own_job):
    split(own_job)
    complete_all(own_job, {(0, 1): "zeta first page", (0, 2): "zeta second page", (1, 1): "alpha only page"})

    response = client.get(f"/v1/jobs/{own_job.pk}/result.jsonl", headers=auth(submit_token))

    assert response.status_code == 200
    assert response["Content-Type"] == "application/jsonl; charset=utf-8"
    records = [json.loads(line) for line in body_of(response).splitlines()]
    assert [(r["document"], r["page"], r["status"], r["text"]) for r in records] == [
        ("zeta.pdf", 1, "done", "zeta first page\n"),
        ("zeta.pdf", 2, "done", "zeta second page\n"),
        ("alpha.png", 1, "done", "alpha only page\n"),
    ]
    first = records[0]
    assert first["lines"] == result_for("zeta first page")["lines"]
    assert first["confidence"] == pytest.approx(91.5)
    assert first["document_id"] == own_job.documents.get(position=0).pk
    assert first["error"] == ""


@pytest.mark.parametrize("suffix", ["result.txt", "result.jsonl"])
def test_under_asgi_a_result_streams_chunk_by_chunk(client, submit_token, own_job, monkeypatch, suffix):
    # Django reads a synchronous iterator whole into memory under ASGI; the result must not be one.
    split(own_job)
    complete_all(own_job, {(0, 1): "zeta first page", (0, 2): "zeta second page", (1, 1): "alpha only page"})
    whole = body_of(client.get(f"/v1/jobs/{own_job.pk}/{suffix}", headers=auth(submit_token)))  # WSGI
    monkeypatch.setattr(api, "RESULT_LINES_PER_CHUNK", 2)

    async def download():
        response = await AsyncClient().get(f"/v1/jobs/{own_job.pk}/{suffix}", headers=auth(submit_token))
        return response.is_async, [chunk async for chunk in response.streaming_content]

    is_async, chunks = async_to_sync(download)()

    assert is_async
    assert len(chunks) > 1
    assert b"".join(chunks).decode() == whole


def test_result_jsonl_keeps_a_failed_pages_error(client, submit_token, own_job):
    split(own_job)
    complete_all(own_job, failures={(1, 1): "the pod did not answer in time"})

    records = [
        json.loads(line)
        for line in body_of(client.get(f"/v1/jobs/{own_job.pk}/result.jsonl", headers=auth(submit_token))).splitlines()
    ]

    failed = [r for r in records if r["status"] == "failed"]
    assert failed == [
        {
            "document": "alpha.png",
            "document_id": own_job.documents.get(position=1).pk,
            "page": 1,
            "status": "failed",
            "text": "",
            "lines": [],
            "confidence": None,
            "width": None,
            "height": None,
            "dpi": None,
            "rotation": None,
            "skew": None,
            "warnings": [],
            "error": "the pod did not answer in time",
        }
    ]


# --- cancel ---------------------------------------------------------------------------


def test_cancel_stops_a_running_job_and_its_waiting_pages(client, submit_token, own_job):
    split(own_job)

    response = client.post(f"/v1/jobs/{own_job.pk}/cancel", headers=auth(submit_token))

    assert response.status_code == 200
    assert response.json()["status"] == "cancelled"
    assert response.json()["pages"]["cancelled"] == 3
    assert set(own_job.pages.values_list("status", flat=True)) == {Page.Status.CANCELLED}


def test_cancel_leaves_a_finished_job_as_it_is(client, submit_token, own_job):
    split(own_job)
    complete_all(own_job)

    response = client.post(f"/v1/jobs/{own_job.pk}/cancel", headers=auth(submit_token))

    assert response.status_code == 200
    assert response.json()["status"] == "done"
    assert response.json()["pages"]["done"] == 3


def test_cancel_needs_the_submit_scope(client, read_token, own_job):
    response = client.post(f"/v1/jobs/{own_job.pk}/cancel", headers=auth(read_token))

    assert response.status_code == 403
    assert response.json() == {"error": "this needs the 'submit' scope"}
    own_job.refresh_from_db()
    assert own_job.status == Job.Status.QUEUED


def test_cancel_answers_only_post(client, submit_token, own_job):
    response = client.get(f"/v1/jobs/{own_job.pk}/cancel", headers=auth(submit_token))

    assert response.status_code == 405
    own_job.refresh_from_db()
    assert own_job.status == Job.Status.QUEUED


# --- retry ----------------------------------------------------------------------------


def test_retry_queues_a_partial_jobs_failed_pages_again(client, submit_token, own_job):
    split(own_job)
    complete_all(own_job, failures={(0, 2): "the pod did not answer in time"})
    broken = own_job.pages.get(document__position=0, number=2)
    own_job.refresh_from_db()
    assert own_job.status == Job.Status.PARTIAL

    response = client.post(f"/v1/jobs/{own_job.pk}/retry", headers=auth(submit_token))

    assert response.status_code == 200
    body = response.json()
    assert body["retried_pages"] == 1
    assert body["status"] == "running"
    assert body["finished_at"] is None
    broken.refresh_from_db()
    assert (broken.status, broken.attempts, broken.error) == (Page.Status.PENDING, 0, "")


@pytest.mark.parametrize("finish", ["not started", "done", "cancelled"])
def test_retry_refuses_a_job_that_is_not_partial_or_failed(client, submit_token, own_job, finish):
    split(own_job)
    if finish == "done":
        complete_all(own_job)
    elif finish == "cancelled":
        job_cancel(job=own_job)
    own_job.refresh_from_db()
    status_before = own_job.status

    response = client.post(f"/v1/jobs/{own_job.pk}/retry", headers=auth(submit_token))

    assert response.status_code == 409
    assert list(response.json()) == ["error"]
    assert "only a partial or failed job" in response.json()["error"]
    own_job.refresh_from_db()
    assert own_job.status == status_before
