"""Corrections of a page's lines (issue 42, item 7): the outputs read the corrected text — result.txt,
.md, .jsonl and the searchable PDF's text layer (pdftotext) — with the engine's reading kept beside
it; only the job's owner or staff correct; bad input is a 4xx JSON error; a PDF built before is
asked for again, by the outputs workers."""

from __future__ import annotations

import json
import subprocess

import pytest

from fleetadmin.clusters import OUTPUTS, SHORT
from ocrjobs.models import LineCorrection, Page, SearchablePdf
from ocrjobs.services.corrections import page_text_with_line
from ocrjobs.services.searchable_pdf import searchable_pdf_build
from ocrjobs.storage import document_bytes
from tests.factories import PAGES_TRUTH, pdf_bytes
from tests.helpers import auth
from tests.ocrjobs.helpers import complete_all, split, submit
from tests.ocrjobs.test_outputs import boxed


@pytest.fixture
def job(ordinary_user, local_pool):
    job = submit(ordinary_user, {"report.pdf": pdf_bytes(PAGES_TRUTH[:2])}, searchable_pdf=True)
    split(job)
    complete_all(
        job, results={(0, 1): boxed(["Water levels rose", "in Mrach 2024"]), (0, 2): boxed(["Three pumps serviced"])}
    )
    return job


def first_page(job) -> Page:
    return job.pages.get(number=1)


def patch(client, job, page, line, body, token):
    return client.patch(f"/v1/jobs/{job.pk}/pages/{page.pk}/lines/{line}", json.dumps(body),
                        content_type="application/json", headers=auth(token))  # fmt: skip


def body_of(response) -> str:
    return b"".join(response.streaming_content).decode()


def pdftotext(pdf: bytes, tmp_path) -> str:
    path = tmp_path / "out.pdf"
    path.write_bytes(pdf)
    return subprocess.run(["pdftotext", "-layout", str(path), "-"], capture_output=True, text=True, check=True).stdout


def test_a_corrected_line_is_in_every_output_with_the_engines_reading_kept(
    client, job, submit_token, tmp_path, django_capture_on_commit_callbacks
):
    document = job.documents.get()
    page = first_page(job)
    searchable_pdf_build(document_id=document.pk)  # built before the correction: it is asked for again
    assert "in Mrach 2024" in pdftotext(document_bytes(SearchablePdf.objects.get().name), tmp_path)

    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        response = patch(client, job, page, 1, {"text": "in March 2024"}, submit_token)

    assert response.status_code == 200, response.content
    assert response.json()["engine_text"] == "in Mrach 2024" and response.json()["by"] == "bob"
    assert SearchablePdf.objects.get().status == SearchablePdf.Status.PENDING and callbacks  # a build asked for
    base = f"/v1/jobs/{job.pk}"
    txt = body_of(client.get(f"{base}/result.txt", headers=auth(submit_token)))
    doc_txt = body_of(client.get(f"{base}/documents/{document.pk}/result.txt", headers=auth(submit_token)))
    md = body_of(client.get(f"{base}/result.md", headers=auth(submit_token)))
    records = [
        json.loads(line)
        for line in body_of(client.get(f"{base}/result.jsonl", headers=auth(submit_token))).splitlines()
    ]
    assert "Water levels rose\nin March 2024\n" in txt and "Mrach" not in txt
    assert doc_txt.startswith("Water levels rose\nin March 2024\f")
    assert "Water levels rose in March 2024" in md and "Mrach" not in md
    assert records[0]["text"] == "Water levels rose\nin March 2024"
    assert records[0]["engine_text"] == "Water levels rose\nin Mrach 2024"
    assert (
        records[0]["lines"][1]["text"] == "in March 2024" and records[0]["lines"][1]["engine_text"] == "in Mrach 2024"
    )
    assert records[0]["lines"][0].get("engine_text") is None  # a line not corrected says nothing more
    row = searchable_pdf_build(document_id=document.pk)
    layer = pdftotext(document_bytes(row.name), tmp_path)
    assert row.status == SearchablePdf.Status.BUILT and "in March 2024" in layer and "Mrach" not in layer


def test_a_second_correction_keeps_the_engines_reading_not_the_first_correction(client, job, submit_token):
    page = first_page(job)
    patch(client, job, page, 1, {"text": "in Marhc 2024"}, submit_token)
    patch(client, job, page, 1, {"text": "in March 2024"}, submit_token)

    correction = LineCorrection.objects.get()
    result = first_page(job).read_result()
    assert (correction.text, correction.engine_text) == ("in March 2024", "in Mrach 2024")
    assert (
        result["text"] == "Water levels rose\nin March 2024"
        and result["engine_text"] == "Water levels rose\nin Mrach 2024"
    )


def test_the_viewers_form_posts_with_the_csrf_token(job, ordinary_user):
    from django.test import Client

    browser = Client(enforce_csrf_checks=True)
    browser.force_login(ordinary_user)
    url = f"/jobs/{job.pk}/pages/{first_page(job).pk}/lines/0"

    refused = browser.post(url, {"text": "Water levels fell"})
    browser.get(f"/jobs/{job.pk}")
    token = browser.cookies["csrftoken"].value
    stored = browser.post(url, {"text": "Water levels fell"}, headers={"X-CSRFToken": token})

    assert refused.status_code == 403
    assert stored.status_code == 200 and stored.json()["text"] == "Water levels fell"
    assert first_page(job).read_result()["lines"][0]["text"] == "Water levels fell"


@pytest.mark.parametrize(
    ("line", "text", "status"),
    [(1, "", 400), (1, "two\nlines", 400), (1, "x" * 2001, 400), (1, 7, 400), (9, "fine", 404), (-1, "fine", 404)],
)
def test_bad_input_is_a_json_error_and_changes_nothing(client, job, submit_token, line, text, status):
    before = first_page(job).result
    url = f"/v1/jobs/{job.pk}/pages/{first_page(job).pk}/lines/{line}"

    response = client.patch(
        url, json.dumps({"text": text}), content_type="application/json", headers=auth(submit_token)
    )

    assert response.status_code == (404 if line < 0 else status) and "error" in response.json()
    assert first_page(job).result == before and not LineCorrection.objects.exists()


def test_the_form_shows_bad_input_as_a_json_error(client, job, ordinary_user):
    client.force_login(ordinary_user)

    response = client.post(f"/jobs/{job.pk}/pages/{first_page(job).pk}/lines/0", {"text": "  "})

    assert response.status_code == 400 and response.json() == {"error": "text: a corrected line cannot be empty"}


def test_another_user_is_refused_and_staff_may_correct(client, job, outsider, admin_user):
    url = f"/jobs/{job.pk}/pages/{first_page(job).pk}/lines/0"
    client.force_login(outsider)
    refused = client.post(url, {"text": "Mine now"})
    client.force_login(admin_user)
    allowed = client.post(url, {"text": "Water levels rose!"})

    assert refused.status_code == 403 and "error" in refused.json()
    assert allowed.status_code == 200 and LineCorrection.objects.get().by == admin_user


def test_a_page_of_another_job_or_not_read_is_refused(client, job, ordinary_user, local_pool):
    other = submit(ordinary_user, {"other.pdf": pdf_bytes(PAGES_TRUTH[:1])})
    split(other)
    client.force_login(ordinary_user)

    elsewhere = client.post(f"/jobs/{job.pk}/pages/{other.pages.get().pk}/lines/0", {"text": "x"})
    unread = client.post(f"/jobs/{other.pk}/pages/{other.pages.get().pk}/lines/0", {"text": "x"})

    assert elsewhere.status_code == 404 and unread.status_code == 409


def test_a_correction_before_the_pdf_is_built_asks_for_no_second_build(
    client, job, submit_token, queued, django_capture_on_commit_callbacks
):
    assert SearchablePdf.objects.get().status == SearchablePdf.Status.PENDING  # the job's end asked for it

    with django_capture_on_commit_callbacks(execute=True):
        patch(client, job, first_page(job), 0, {"text": "Water levels fell"}, submit_token)

    assert SearchablePdf.objects.get().generation == 1 and queued(OUTPUTS) == []  # the pending build reads it


def test_a_correction_after_the_build_asks_the_outputs_workers_not_the_page_path(
    client, job, submit_token, queued, django_capture_on_commit_callbacks
):
    searchable_pdf_build(document_id=job.documents.get().pk)

    with django_capture_on_commit_callbacks(execute=True):
        patch(client, job, first_page(job), 0, {"text": "Water levels fell"}, submit_token)

    assert queued(OUTPUTS) == ["ocrjobs.output_tasks.request_searchable_pdfs"] and queued(SHORT) == []
    assert SearchablePdf.objects.get().generation == 2


def test_a_line_read_twice_on_a_page_is_replaced_where_it_is():
    lines = [{"text": "total"}, {"text": "12"}, {"text": "total"}]
    assert page_text_with_line("total\n12\n\ntotal\n", lines, 2, "sum") == "total\n12\n\nsum\n"
    assert page_text_with_line("rewritten", lines, 1, "13") == "total\n13\ntotal"


def test_a_session_patch_needs_the_csrf_token_as_a_form_does(job, ordinary_user):
    from django.test import Client

    browser = Client(enforce_csrf_checks=True)
    browser.force_login(ordinary_user)

    response = browser.patch(f"/v1/jobs/{job.pk}/pages/{first_page(job).pk}/lines/0", json.dumps({"text": "forged"}),
                             content_type="application/json")  # fmt: skip

    assert response.status_code == 403 and response.json() == {"error": "CSRF check failed"}
    assert not LineCorrection.objects.exists()
