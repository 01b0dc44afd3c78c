"""The job pages for people: the upload form, a job's page, cancel and retry buttons."""

from __future__ import annotations

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from ocrjobs.models import Document, Job, KeptUpload, Page
from tests.factories import (
    PAGES_TRUTH,
    corrupt_pdf_bytes,
    encrypted_pdf_bytes,
    image_bytes,
    pdf_bytes,
    zero_page_pdf_bytes,
)
from tests.helpers import page_text
from tests.ocrjobs.helpers import assert_nothing_made, complete_all, files_under, split, submit

pytestmark = pytest.mark.usefixtures("local_pool")

NEW = "/jobs/new"


def assert_no_job_and_the_files_kept(media_root) -> None:
    """A refused submit makes no job; the files chosen are kept for the form shown again, and
    nothing else is stored."""
    assert Job.objects.count() == Document.objects.count() == Page.objects.count() == 0
    kept = list(KeptUpload.objects.order_by("pk"))
    stored = files_under(media_root)
    assert sorted(str(p.relative_to(media_root)) for p in stored) == sorted(k.source for k in kept)


def upload(*files: tuple[str, bytes], **fields) -> dict:
    return {
        "files": [SimpleUploadedFile(name, content) for name, content in files],
        "pool": "local",
        "languages": "eng",
        **fields,
    }


def test_the_form_offers_the_pools(bob):
    response = bob.get(NEW)

    assert response.status_code == 200
    assert 'value="local"' in response.content.decode()
    assert 'enctype="multipart/form-data"' in response.content.decode()


def test_a_good_upload_creates_the_job_and_redirects_to_its_page(bob, ordinary_user):
    response = bob.post(NEW, upload(("report.pdf", pdf_bytes()), ("note.png", image_bytes(["a note"]))))

    job = Job.objects.get()
    assert response.status_code == 302
    assert response["Location"] == f"/jobs/{job.pk}"
    assert job.owner == ordinary_user
    assert [(d.name, d.page_count) for d in job.documents.all()] == [("report.pdf", 3), ("note.png", 1)]
    assert f"Job {job.pk} submitted." in page_text(bob.get(response["Location"]))


@pytest.mark.parametrize(
    ("files", "fields", "shown"),
    [
        ([("empty.pdf", b"")], {}, "The submitted file is empty."),
        ([("notes.txt", b"plain words\n")], {}, "notes.txt: not a PDF, PNG, JPEG or TIFF file"),
        ([("broken.pdf", corrupt_pdf_bytes())], {}, "broken.pdf: the PDF is corrupt"),
        ([("secret.pdf", encrypted_pdf_bytes())], {}, "secret.pdf: the PDF is encrypted"),
        ([("blank.pdf", zero_page_pdf_bytes())], {}, "blank.pdf: the document has no pages"),
        ([("good.pdf", pdf_bytes()), ("bad.pdf", corrupt_pdf_bytes())], {}, "bad.pdf: the PDF is corrupt"),
        ([], {}, "no files: send at least one PDF or image"),
        ([("a.pdf", pdf_bytes(PAGES_TRUTH[:1]))], {"pool": "nowhere"}, "Select a valid choice."),
        ([("a.pdf", pdf_bytes(PAGES_TRUTH[:1]))], {"languages": "eng; rm"}, "languages must look like"),
    ],
    ids=["empty", "text", "corrupt", "encrypted", "no pages", "good and bad", "no files", "pool", "languages"],
)
def test_a_bad_upload_shows_the_form_again_with_the_error_and_makes_nothing(bob, media_root, files, fields, shown):
    response = bob.post(NEW, upload(*files, **fields))

    assert response.status_code == 400
    text = page_text(response)
    assert shown in text
    assert '<form method="post" enctype="multipart/form-data"' in text
    assert_no_job_and_the_files_kept(media_root)


def test_a_file_over_the_size_limit_is_refused_on_the_form(bob, media_root, settings):
    settings.OCR_MAX_FILE_BYTES = 1000

    response = bob.post(NEW, upload(("big.pdf", pdf_bytes(PAGES_TRUTH[:1]))))

    assert response.status_code == 400
    assert "big.pdf: the file is larger than the limit of 1000 bytes" in page_text(response)
    assert_no_job_and_the_files_kept(media_root)


def test_a_document_over_the_page_limit_is_refused_on_the_form(bob, media_root, settings):
    settings.OCR_MAX_PAGES_PER_DOCUMENT = 2

    response = bob.post(NEW, upload(("long.pdf", pdf_bytes())))

    assert response.status_code == 400
    assert "long.pdf: 3 pages; the limit is 2 pages per document" in page_text(response)
    assert_no_job_and_the_files_kept(media_root)


def test_an_anonymous_visitor_is_sent_to_log_in(client, media_root):
    shown = client.get(NEW)
    posted = client.post(NEW, upload(("a.pdf", pdf_bytes(PAGES_TRUTH[:1]))))

    assert shown.status_code == 302
    assert shown["Location"] == f"/login/?next={NEW}"
    assert posted.status_code == 302
    assert posted["Location"].startswith("/login/")
    assert_nothing_made(media_root)


# --- a job's page -----------------------------------------------------------------------


def test_the_job_page_shows_the_text_once_the_pages_are_done(bob, ordinary_user):
    job = submit(ordinary_user, {"report.pdf": pdf_bytes(PAGES_TRUTH[:2])})
    split(job)

    before = page_text(bob.get(f"/jobs/{job.pk}"))
    complete_all(job, {(0, 1): "Water levels rose <sharply>", (0, 2): "Three pumps were serviced"})
    after = bob.get(f"/jobs/{job.pk}")

    assert "Water levels rose" not in before
    assert after.status_code == 200
    raw = after.content.decode()
    assert "Water levels rose &lt;sharply&gt;" in raw  # text from a page is never markup
    assert "Three pumps were serviced" in raw
    assert '<strong class="status-done">done</strong>' in raw


def test_the_job_page_shows_a_failed_pages_error(bob, ordinary_user):
    job = submit(ordinary_user, {"report.pdf": pdf_bytes(PAGES_TRUTH[:2])})
    split(job)
    complete_all(job, failures={(0, 2): "the pod refused the page: unreadable"})

    text = page_text(bob.get(f"/jobs/{job.pk}"))

    assert "the pod refused the page: unreadable" in text
    assert "Retry failed pages" in text


def test_another_users_job_page_is_not_found(client, outsider, ordinary_user):
    job = submit(ordinary_user, {"note.png": image_bytes(["private"])})
    client.force_login(outsider)

    assert client.get(f"/jobs/{job.pk}").status_code == 404
    assert client.get(f"/jobs/{job.pk}/progress").status_code == 404


def test_staff_can_open_any_users_job_page(client, admin_user, ordinary_user):
    job = submit(ordinary_user, {"note.png": image_bytes(["a note"])})
    client.force_login(admin_user)

    assert client.get(f"/jobs/{job.pk}").status_code == 200


def test_the_job_list_shows_only_the_users_own_jobs(client, outsider, ordinary_user):
    mine = submit(outsider, {"mine.png": image_bytes(["mine"])})
    theirs = submit(ordinary_user, {"theirs.png": image_bytes(["theirs"])})
    client.force_login(outsider)

    text = page_text(client.get("/jobs/"))

    assert f"/jobs/{mine.pk}" in text
    assert f"/jobs/{theirs.pk}" not in text


def test_the_fallback_poll_swaps_the_ended_jobs_sections_without_a_reload(bob, ordinary_user):
    """Issue 42: the page reloaded itself when the job ended, and a retry's message vanished with
    it. The poll (a page without a websocket) now swaps the same sections the push does."""
    job = submit(ordinary_user, {"note.png": image_bytes(["a note"])})
    split(job)

    running = bob.get(f"/jobs/{job.pk}/progress")
    complete_all(job)
    finished = bob.get(f"/jobs/{job.pk}/progress")

    assert "HX-Refresh" not in running.headers and "HX-Refresh" not in finished.headers
    assert "Cancel job" in running.content.decode() and "Cancel job" not in finished.content.decode()
    for section in ('id="job-progress" hx-swap-oob', 'id="job-actions" hx-swap-oob', 'id="job-documents" hx-swap-oob',
                    'id="job-escalations" hx-swap-oob',
                    'id="job-events" hx-swap-oob'):  # fmt: skip
        assert section in finished.content.decode()
    assert "result.txt" in finished.content.decode() and "Ended: done" in finished.content.decode()


# --- buttons ----------------------------------------------------------------------------


def test_the_cancel_button_cancels_the_job(bob, ordinary_user):
    job = submit(ordinary_user, {"report.pdf": pdf_bytes()})
    split(job)

    response = bob.post(f"/jobs/{job.pk}/cancel")

    assert response.status_code == 302
    job.refresh_from_db()
    assert job.status == Job.Status.CANCELLED
    assert set(job.pages.values_list("status", flat=True)) == {Page.Status.CANCELLED}


def test_cancel_by_get_does_nothing(bob, ordinary_user):
    job = submit(ordinary_user, {"report.pdf": pdf_bytes()})

    assert bob.get(f"/jobs/{job.pk}/cancel").status_code == 405
    job.refresh_from_db()
    assert job.status == Job.Status.QUEUED


def test_another_user_cannot_cancel_a_job(client, outsider, ordinary_user):
    job = submit(ordinary_user, {"report.pdf": pdf_bytes()})
    client.force_login(outsider)

    assert client.post(f"/jobs/{job.pk}/cancel").status_code == 404
    job.refresh_from_db()
    assert job.status == Job.Status.QUEUED


def test_the_retry_button_queues_failed_pages_again(bob, ordinary_user):
    job = submit(ordinary_user, {"report.pdf": pdf_bytes()})
    split(job)
    complete_all(job, failures={(0, 3): "HTTP 500: boom"})

    response = bob.post(f"/jobs/{job.pk}/retry", follow=True)

    assert "1 failed pages and 0 failed documents queued again." in page_text(response)
    job.refresh_from_db()
    assert job.status == Job.Status.RUNNING
    assert job.pages.get(number=3).status == Page.Status.PENDING
