"""Issue 25's outputs for jobs that did not finish whole (cancelled, failed pages), building them
again (the job page's button, POST /v1/jobs/{id}/outputs/rebuild) without a stale build ever
winning, the API's per-document output state, and the index that serves the viewer's "to check"
list on both databases."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from django.db import connection
from django.test import Client
from django.utils import timezone

from ocrjobs.models import Job, OutputRebuild, Page, SearchablePdf
from ocrjobs.services import searchable_pdf
from ocrjobs.services.jobs import job_cancel, job_refresh
from ocrjobs.services.outputs import job_outputs_rebuild
from ocrjobs.services.pages import page_complete, pages_claim
from ocrjobs.services.searchable_pdf import searchable_pdf_build
from ocrjobs.storage import document_bytes, documents
from ocrjobs.viewer import viewer_pages
from tests.factories import PAGES_TRUTH, pdf_bytes
from tests.helpers import auth
from tests.ocrjobs.helpers import complete_all, split, submit, tiff_bytes
from tests.ocrjobs.test_outputs import boxed, built_pdf, sizes_of, text_of

LINES = ["Water levels rose", "Three pumps serviced", "Budget report north"]


def read_some(job: Job, read: set[int]) -> None:
    """Split the job and store a result for its pages numbered in ``read`` (the others stay out)."""
    split(job)
    token = uuid.uuid4().hex
    for claim in pages_claim(pool_id=job.pool_id, token=token, limit=1000):
        number = Page.objects.get(pk=claim.id).number
        if number in read:
            assert page_complete(page_id=claim.id, token=token, pod_id=None, result=boxed([LINES[number - 1]]))


@pytest.fixture
def three_pages(ordinary_user, local_pool) -> Job:
    return submit(ordinary_user, {"report.pdf": pdf_bytes(PAGES_TRUTH[:3])}, searchable_pdf=True)


@pytest.fixture
def done_job(ordinary_user, local_pool) -> Job:
    job = submit(ordinary_user, {"report.pdf": pdf_bytes(PAGES_TRUTH[:1])}, searchable_pdf=True)
    split(job)
    complete_all(job, results={(0, 1): boxed(["Water levels rose"])})
    return job


# --- a cancelled job, a failed page ---------------------------------------------------------------


def test_a_cancelled_jobs_read_pages_get_their_outputs_marked_partial(three_pages, client, submit_token):
    read_some(three_pages, {1})
    job = job_cancel(job=three_pages)
    assert job.status == Job.Status.CANCELLED
    document = job.documents.get()
    assert SearchablePdf.objects.get(pk=document.pk).status == SearchablePdf.Status.PENDING

    built = built_pdf(job)
    row = SearchablePdf.objects.get(pk=document.pk)
    assert row.pages_missing == 2
    assert [text.strip() for text in text_of(built)] == [LINES[0], "", ""]  # the others as they were
    assert sizes_of(built) == sizes_of(pdf_bytes(PAGES_TRUTH[:3]))
    base = f"/v1/jobs/{job.pk}/documents/{document.pk}"
    response = client.get(f"{base}/result.pdf", headers=auth(submit_token))
    assert response.status_code == 200 and response["X-Pages-Missing"] == "2"
    markdown = b"".join(client.get(f"{base}/result.md", headers=auth(submit_token)).streaming_content).decode()
    assert "Water levels rose" in markdown and "page 2: cancelled" in markdown and "page 3: cancelled" in markdown
    text = b"".join(client.get(f"{base}/result.txt", headers=auth(submit_token)).streaming_content).decode()
    assert text.split("\f")[0].strip() == LINES[0] and len(text.split("\f")) == 3
    pdf = client.get(f"/v1/jobs/{job.pk}", headers=auth(submit_token)).json()["documents"][0]["outputs"]["pdf"]
    assert pdf["state"] == "ready" and pdf["partial"] is True and pdf["pages_missing"] == 2


def test_a_failed_page_keeps_its_original_page_without_a_text_layer(three_pages):
    read_some(three_pages, {1, 3})
    Page.objects.filter(job=three_pages, number=2).update(
        status=Page.Status.FAILED, error="engine crashed", claim_token=""
    )
    job = job_refresh(job_id=three_pages.pk)
    assert job.status == Job.Status.PARTIAL

    built = built_pdf(job)

    assert [text.strip() for text in text_of(built)] == [LINES[0], "", LINES[2]]
    assert sizes_of(built) == sizes_of(pdf_bytes(PAGES_TRUTH[:3]))
    assert SearchablePdf.objects.get(document__job=job).pages_missing == 1


def test_a_cancelled_job_with_nothing_read_asks_for_nothing(three_pages, queued, django_capture_on_commit_callbacks):
    read_some(three_pages, set())
    with django_capture_on_commit_callbacks(execute=True):
        job_cancel(job=three_pages)
    assert not SearchablePdf.objects.exists()
    assert "ocrjobs.output_tasks.request_searchable_pdfs" not in queued()


# --- rebuilding, and the race it must not lose ----------------------------------------------------


def test_the_api_rebuilds_the_owners_job(client, submit_token, done_job, queued, django_capture_on_commit_callbacks):
    document = done_job.documents.get()
    searchable_pdf_build(document_id=document.pk)
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(f"/v1/jobs/{done_job.pk}/outputs/rebuild", headers=auth(submit_token))

    assert response.status_code == 202
    body = response.json()
    assert body["rebuilding_documents"] == 1 and body["documents"][0]["outputs"]["pdf"]["state"] == "pending"
    assert "ocrjobs.output_tasks.request_searchable_pdfs" in queued()
    row = SearchablePdf.objects.get(pk=document.pk)
    assert row.status == SearchablePdf.Status.PENDING and row.generation == 2  # the job's end, then this


def test_the_api_refuses_a_rebuild_to_others_and_before_the_job_ends(
    client, submit_token, read_token, admin_token, outsider, done_job
):
    url = f"/v1/jobs/{done_job.pk}/outputs/rebuild"
    assert client.post(url, headers=auth(read_token)).status_code == 403  # a read token: no submit scope
    assert client.post(url, headers=auth(admin_token)).status_code == 403  # sees the job, does not own it
    assert client.get(url, headers=auth(submit_token)).status_code == 405
    Job.objects.filter(pk=done_job.pk).update(status=Job.Status.RUNNING)
    response = client.post(url, headers=auth(submit_token))
    assert response.status_code == 409 and "running" in response.json()["error"]
    assert SearchablePdf.objects.get().generation == 1


def test_the_job_page_has_a_rebuild_button_for_its_owner(client, ordinary_user, admin_user, done_job):
    client.force_login(ordinary_user)
    page = client.get(f"/jobs/{done_job.pk}").content.decode()
    assert f'action="/jobs/{done_job.pk}/outputs/rebuild"' in page
    response = client.post(f"/jobs/{done_job.pk}/outputs/rebuild")
    assert response.status_code == 302
    assert SearchablePdf.objects.get().generation == 2

    client.force_login(admin_user)
    assert "outputs/rebuild" not in client.get(f"/jobs/{done_job.pk}").content.decode()
    assert client.post(f"/jobs/{done_job.pk}/outputs/rebuild").status_code == 403
    assert SearchablePdf.objects.get().generation == 2


def test_the_job_page_of_a_job_that_did_not_ask_for_pdfs_offers_to_build_them(
    client, ordinary_user, local_pool, django_capture_on_commit_callbacks
):
    job = submit(ordinary_user, {"report.pdf": pdf_bytes(PAGES_TRUTH[:1])})
    split(job)
    complete_all(job, results={(0, 1): boxed(["Water levels rose"])})
    client.force_login(ordinary_user)

    page = client.get(f"/jobs/{job.pk}").content.decode()
    assert "PDF not asked for" in page and "<button>Build searchable PDFs</button>" in page
    with django_capture_on_commit_callbacks(execute=False):
        assert client.post(f"/jobs/{job.pk}/outputs/rebuild").status_code == 302

    assert SearchablePdf.objects.get().status == SearchablePdf.Status.PENDING
    assert "PDF being built" in client.get(f"/jobs/{job.pk}").content.decode()


def test_a_rebuild_of_a_job_with_no_page_read_is_refused(client, submit_token, three_pages):
    split(three_pages)
    three_pages.pages.update(status=Page.Status.CANCELLED)
    Job.objects.filter(pk=three_pages.pk).update(status=Job.Status.CANCELLED)

    response = client.post(f"/v1/jobs/{three_pages.pk}/outputs/rebuild", headers=auth(submit_token))

    assert response.status_code == 409 and "no page read" in response.json()["error"]
    assert not OutputRebuild.objects.exists() and not SearchablePdf.objects.exists()


def test_one_users_rebuilds_are_limited_per_hour(client, submit_token, done_job, settings):
    settings.OUTPUT_REBUILDS_PER_HOUR = 3
    url = f"/v1/jobs/{done_job.pk}/outputs/rebuild"

    answers = [client.post(url, headers=auth(submit_token)).status_code for _ in range(4)]
    OutputRebuild.objects.update(at=timezone.now() - timezone.timedelta(minutes=61))
    later = client.post(url, headers=auth(submit_token))

    assert answers == [202, 202, 202, 429] and later.status_code == 202
    assert SearchablePdf.objects.get().generation == 1 + 4  # the job's end, then the four rebuilds let through


def test_the_job_page_says_why_a_rebuild_was_refused(client, ordinary_user, done_job, settings):
    settings.OUTPUT_REBUILDS_PER_HOUR = 1
    client.force_login(ordinary_user)
    client.post(f"/jobs/{done_job.pk}/outputs/rebuild")

    page = client.post(f"/jobs/{done_job.pk}/outputs/rebuild", follow=True).content.decode()

    assert "rebuilds in the last hour" in page and SearchablePdf.objects.get().generation == 2


def test_the_rebuild_button_needs_the_csrf_token(ordinary_user, done_job):
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(ordinary_user)
    assert browser.post(f"/jobs/{done_job.pk}/outputs/rebuild").status_code == 403
    assert SearchablePdf.objects.get().generation == 1


def test_a_build_overtaken_by_a_rebuild_never_replaces_the_later_build(
    done_job, monkeypatch, django_capture_on_commit_callbacks
):
    """Build A starts; a rebuild is asked for and build B runs whole while A is still writing; A
    ends last. B's file is the one kept, A's is removed."""
    document = done_job.documents.get()
    real_overlay, calls, later = searchable_pdf._overlay_pdf, [], []

    def overlay_then_overtaken(source, doc, target, lease):
        real_overlay(source, doc, target, lease)
        calls.append(doc.pk)
        if len(calls) == 1:  # (only build A: B runs the real thing)
            job_outputs_rebuild(job=done_job, user=done_job.owner)
            later.append(searchable_pdf_build(document_id=doc.pk))

    monkeypatch.setattr(searchable_pdf, "_overlay_pdf", overlay_then_overtaken)
    with django_capture_on_commit_callbacks(execute=True):
        searchable_pdf_build(document_id=document.pk)

    row = SearchablePdf.objects.get(pk=document.pk)
    assert row.status == SearchablePdf.Status.BUILT and row.name == later[0].name and row.builds == 2
    folder = Path(documents().path(row.name)).parent
    assert [p.name for p in folder.iterdir()] == [Path(row.name).name]  # A's file removed, never stored
    assert text_of(document_bytes(row.name))[0].strip() == "Water levels rose"


def test_a_stale_build_that_fails_does_not_mark_the_later_build_failed(done_job, monkeypatch):
    document = done_job.documents.get()
    real_overlay, calls, later = searchable_pdf._overlay_pdf, [], []

    def overtaken_then_failing(source, doc, target, lease):
        calls.append(doc.pk)
        if len(calls) > 1:
            return real_overlay(source, doc, target, lease)
        job_outputs_rebuild(job=done_job, user=done_job.owner)
        later.append(searchable_pdf_build(document_id=doc.pk))
        raise RuntimeError("the stale build breaks")

    monkeypatch.setattr(searchable_pdf, "_overlay_pdf", overtaken_then_failing)
    searchable_pdf_build(document_id=document.pk)

    row = SearchablePdf.objects.get(pk=document.pk)
    assert row.status == SearchablePdf.Status.BUILT and row.error == "" and row.name == later[0].name


def test_a_build_under_way_shows_building(done_job, monkeypatch, client, submit_token):
    document = done_job.documents.get()
    seen = []

    def look(source, doc, target, lease):
        seen.append(client.get(f"/v1/jobs/{done_job.pk}", headers=auth(submit_token)).json())
        pdf = client.get(f"/v1/jobs/{done_job.pk}/documents/{doc.pk}/result.pdf", headers=auth(submit_token))
        seen.append(pdf.status_code)
        raise RuntimeError("stop here")

    monkeypatch.setattr(searchable_pdf, "_overlay_pdf", look)
    searchable_pdf_build(document_id=document.pk)
    assert seen[0]["documents"][0]["outputs"]["pdf"]["state"] == "building" and seen[1] == 202


# --- the API's output state -----------------------------------------------------------------------


def test_the_job_body_shows_each_documents_outputs(client, submit_token, three_pages):
    url = f"/v1/jobs/{three_pages.pk}"
    before = client.get(url, headers=auth(submit_token)).json()["documents"][0]["outputs"]
    assert before["pdf"] == {"state": "pending"}
    document = three_pages.documents.get()
    assert before["txt"] == f"/v1/jobs/{three_pages.pk}/documents/{document.pk}/result.txt"

    read_some(three_pages, {1, 2, 3})
    job_refresh(job_id=three_pages.pk)
    assert client.get(url, headers=auth(submit_token)).json()["documents"][0]["outputs"]["pdf"]["state"] == "pending"
    row = searchable_pdf_build(document_id=document.pk)
    pdf = client.get(url, headers=auth(submit_token)).json()["documents"][0]["outputs"]["pdf"]
    assert pdf["state"] == "ready" and pdf["partial"] is False and pdf["size_bytes"] == row.size_bytes
    assert client.get(pdf["url"], headers=auth(submit_token)).status_code == 200

    SearchablePdf.objects.filter(pk=document.pk).update(status=SearchablePdf.Status.FAILED, error="broken")
    pdf = client.get(url, headers=auth(submit_token)).json()["documents"][0]["outputs"]["pdf"]
    assert pdf["state"] == "failed" and pdf["error"] == "broken" and "url" not in pdf


def test_a_failed_job_shows_no_pdf_to_come(client, submit_token, three_pages):
    split(three_pages)
    Page.objects.filter(job=three_pages).update(status=Page.Status.FAILED, error="engine crashed")
    assert job_refresh(job_id=three_pages.pk).status == Job.Status.FAILED
    body = client.get(f"/v1/jobs/{three_pages.pk}", headers=auth(submit_token)).json()
    assert body["documents"][0]["outputs"]["pdf"] == {"state": "none"}


# --- the viewer's "to check" list has its index ---------------------------------------------------


def test_the_to_check_list_is_read_through_its_index(done_job):
    pages = viewer_pages(done_job, threshold=80.0, only_to_check=True).values_list("pk", flat=True)
    sql, params = pages.query.sql_with_params()
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            # A few rows, and statistics left by earlier tests: the planner may pick any index that
            # narrows them (page_status_finished_idx once the table was analysed). Asked is whether
            # this index serves the query with the threshold as an index condition, so the other
            # indexes of the table are dropped inside a savepoint, rolled back after the EXPLAIN.
            cursor.execute("SAVEPOINT plan_check")
            cursor.execute(
                "SELECT i.relname FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid "
                "JOIN pg_class t ON t.oid = x.indrelid WHERE t.relname = 'ocrjobs_page' "
                "AND NOT x.indisunique AND i.relname <> 'page_job_status_conf_idx'"
            )
            for (name,) in cursor.fetchall():
                cursor.execute(f'DROP INDEX IF EXISTS "{name}"')
            cursor.execute("SET LOCAL enable_seqscan = off")
            cursor.execute("EXPLAIN " + sql, params)
            rows = cursor.fetchall()
            cursor.execute("ROLLBACK TO SAVEPOINT plan_check")
        else:
            cursor.execute("EXPLAIN QUERY PLAN " + sql, params)
            rows = cursor.fetchall()
        plan = "\n".join(str(row[-1]) for row in rows)
    assert "page_job_status_conf_idx" in plan, plan
    if connection.vendor == "postgresql":
        assert "confidence <" in plan, plan  # the threshold is an index condition, not a filter of rows
    else:
        assert "confidence<?" in plan, plan


def test_a_build_overtaken_by_a_rebuild_stops_at_its_next_chunk_of_frames(ordinary_user, monkeypatch, settings):
    """A rebuild storm burns no more than a chunk of frames per rebuild: the build under way stops
    at its next chunk (one read), not at its next lease renewal (TASK_LEASE_SECONDS / 3 later)."""
    settings.OUTPUT_REBUILDS_PER_HOUR = 10
    job = submit(ordinary_user, {"scan.tif": tiff_bytes([(200, 100)] * 3)}, searchable_pdf=True)
    split(job)
    complete_all(job)
    monkeypatch.setattr(searchable_pdf, "IMAGES_PER_LAYER", 1)
    real_as_read, drawn = searchable_pdf._as_read, []

    def drawn_then_rebuilt(frame, result):
        drawn.append(frame.size)
        if len(drawn) == 1:
            job_outputs_rebuild(job=job, user=ordinary_user)
        return real_as_read(frame, result)

    monkeypatch.setattr(searchable_pdf, "_as_read", drawn_then_rebuilt)
    row = searchable_pdf_build(document_id=job.documents.get().pk)

    assert len(drawn) == 1  # frames 2 and 3 never drawn
    assert row.status == SearchablePdf.Status.PENDING and row.generation == 2  # left to the rebuild's build
