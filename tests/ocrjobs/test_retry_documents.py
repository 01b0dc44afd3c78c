"""Retry covers failed documents too: a URL whose fetch failed is fetched again (and then split
and read), from the API and from the job page."""

from __future__ import annotations

import pytest

from ocrjobs.models import Document, Job, Page
from ocrjobs.services.fetch import document_fetch
from ocrjobs.services.jobs import job_retry
from tests.factories import pdf_bytes
from tests.ocrjobs.test_url_documents import file_server  # noqa: F401 (a fixture)

pytestmark = pytest.mark.usefixtures("local_pool")


@pytest.fixture
def failed_fetch(file_server, ordinary_user, local_pool, settings, queued):  # noqa: F811
    """A job of one URL document whose server answered 503: the document and the job failed."""
    settings.URL_FETCH_ALLOW_PRIVATE = True
    base, routes = file_server
    routes["/report.pdf"] = (503, {}, b"")
    job = Job.objects.create(owner=ordinary_user, pool=local_pool)
    document = Document.objects.create(job=job, position=0, name="report.pdf", kind="url",
                                       url=f"{base}/report.pdf", size_bytes=0, page_count=0)  # fmt: skip
    document = document_fetch(document_id=document.pk)
    assert document.status == Document.Status.FAILED and "503" in document.error
    assert Job.objects.get(pk=job.pk).status == Job.Status.FAILED
    routes["/report.pdf"] = (200, {}, pdf_bytes())  # the server is back
    return job


def test_a_failed_fetch_is_fetched_again_and_split(failed_fetch, queued, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        pages, documents = job_retry(job=failed_fetch)

    assert (pages, documents) == (0, 1)
    job = Job.objects.get(pk=failed_fetch.pk)
    assert job.status == Job.Status.RUNNING and job.finished_at is None
    document = job.documents.get()
    assert (document.status, document.error) == (Document.Status.PENDING, "")
    assert "ocrjobs.tasks.fetch_document" in queued()

    document = document_fetch(document_id=document.pk)  # what the queued task does

    assert (document.kind, document.status, document.page_count) == ("pdf", Document.Status.SPLIT, 3)
    assert Page.objects.filter(job=job, status=Page.Status.PENDING).count() == 3


def test_the_api_retries_failed_documents_and_says_how_many(client, submit_token, failed_fetch, queued):
    response = client.post(f"/v1/jobs/{failed_fetch.pk}/retry", headers={"Authorization": f"Bearer {submit_token}"})

    assert response.status_code == 200, response.content
    body = response.json()
    assert (body["retried_pages"], body["retried_documents"]) == (0, 1)
    assert body["status"] == "running"


def test_the_job_page_retries_failed_documents(client, ordinary_user, failed_fetch, queued):
    client.force_login(ordinary_user)

    response = client.post(f"/jobs/{failed_fetch.pk}/retry", follow=True)

    assert "0 failed pages and 1 failed documents queued again." in response.content.decode()
    assert Job.objects.get(pk=failed_fetch.pk).documents.get().status == Document.Status.PENDING


def test_a_finished_job_with_nothing_failed_retries_nothing(failed_fetch):
    Job.objects.filter(pk=failed_fetch.pk).update(status=Job.Status.DONE)

    assert job_retry(job=failed_fetch) == (0, 0)
    assert failed_fetch.documents.get().status == Document.Status.FAILED
