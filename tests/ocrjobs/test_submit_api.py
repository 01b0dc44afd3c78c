"""POST /v1/jobs: a good submission, every bad input, and who may submit."""

from __future__ import annotations

import json

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from ocrjobs.models import Document, Job, Page
from tests.factories import (
    PAGES_TRUTH,
    corrupt_pdf_bytes,
    encrypted_pdf_bytes,
    image_bytes,
    pdf_bytes,
    zero_page_pdf_bytes,
)
from tests.ocrjobs.helpers import assert_nothing_made, blank_tiff_frames, files_under, tiff_bytes

URL = "/v1/jobs"

pytestmark = pytest.mark.usefixtures("local_pool")


def post_files(client: Client, token: str | None, files: list[tuple[str, bytes]], **fields) -> object:
    data = {"files": [SimpleUploadedFile(name, content) for name, content in files], **fields}
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return client.post(URL, data, headers=headers)


def assert_refused(response, status: int, *words: str) -> str:
    """The answer is exactly {"error": "..."} with the status, and the message names the problem."""
    assert response.status_code == status, response.content
    assert response["Content-Type"] == "application/json"
    body = json.loads(response.content)
    assert list(body) == ["error"]
    message = body["error"]
    assert isinstance(message, str)
    for word in words:
        assert word.lower() in message.lower(), message
    return message


def raw_multipart(parts: list[tuple[str, str | None, bytes]]) -> tuple[bytes, str]:
    """A multipart body written by hand, so that file names reach the server as sent."""
    boundary = "fleetadmin-test-boundary"
    chunks = []
    for field, filename, content in parts:
        disposition = f'form-data; name="{field}"'
        if filename is not None:
            disposition += f'; filename="{filename}"'
        chunks.append(
            f"--{boundary}\r\nContent-Disposition: {disposition}\r\n"
            "Content-Type: application/octet-stream\r\n\r\n".encode()
            + content
            + b"\r\n"
        )
    chunks.append(f"--{boundary}--\r\n".encode())
    return b"".join(chunks), f"multipart/form-data; boundary={boundary}"


# --- a good submission --------------------------------------------------------


def test_it_accepts_a_pdf_and_answers_201_with_the_job(client, submit_token, ordinary_user, media_root):
    response = post_files(client, submit_token, [("report.pdf", pdf_bytes())], pool="local", languages="eng")

    assert response.status_code == 201, response.content
    body = response.json()
    job = Job.objects.get(pk=body["id"])
    assert job.owner == ordinary_user
    assert job.pool.key == "local"
    assert body["status"] == "queued"
    assert [(d["name"], d["kind"], d["page_count"]) for d in body["documents"]] == [("report.pdf", "pdf", 3)]
    assert body["pages"]["total"] == 0  # pages appear when a worker splits the document
    assert body["urls"]["self"] == f"/v1/jobs/{job.pk}"
    document = job.documents.get()
    assert document.source_path.read_bytes()[:5] == b"%PDF-"
    assert document.source_path.is_relative_to(media_root)


def test_the_answer_to_a_submission_is_the_job_as_get_shows_it_without_reading_it_back(
    client, submit_token, read_token
):
    files = [("a.pdf", pdf_bytes(PAGES_TRUTH[:2])), ("b.png", image_bytes(["one line"]))]

    with CaptureQueriesContext(connection) as queries:
        response = post_files(client, submit_token, files, urls="https://example.org/c.pdf", max_dollars="5")

    assert response.status_code == 201, response.content
    shown = client.get(f"{URL}/{response.json()['id']}", headers={"Authorization": f"Bearer {read_token}"})
    assert response.json() == shown.json()
    # What the request made (documents, no pages, no spend, no deliveries) is not read back.
    read_back = [q["sql"] for q in queries.captured_queries if q["sql"].startswith("SELECT")]
    for table in ("ocrjobs_document", "ocrjobs_page", "pods_spendentry", "ocrjobs_webhookdelivery"):
        assert not [sql for sql in read_back if f'FROM "{table}"' in sql], table


def test_it_accepts_several_files_and_counts_each_documents_pages(client, submit_token):
    files = [
        ("a.pdf", pdf_bytes(PAGES_TRUTH[:2])),
        ("b.png", image_bytes(["one line"])),
        ("c.jpg", image_bytes(["x"], "JPEG")),
    ]
    response = post_files(client, submit_token, files)

    assert response.status_code == 201, response.content
    documents = response.json()["documents"]
    assert [(d["name"], d["kind"], d["page_count"]) for d in documents] == [
        ("a.pdf", "pdf", 2),
        ("b.png", "image", 1),
        ("c.jpg", "image", 1),
    ]


def test_it_enqueues_the_split_of_its_documents_once_the_job_is_committed(
    client, submit_token, django_capture_on_commit_callbacks, queued
):
    with django_capture_on_commit_callbacks(execute=True):
        response = post_files(client, submit_token, [("a.pdf", pdf_bytes()), ("b.png", image_bytes(["x"]))])

    assert response.status_code == 201
    assert queued() == ["ocrjobs.tasks.split_documents"]  # one task for a submission's documents


# --- bad files ------------------------------------------------------------------


def test_it_refuses_an_empty_file(client, submit_token, media_root):
    response = post_files(client, submit_token, [("empty.pdf", b"")])

    assert_refused(response, 400, "empty.pdf", "empty")
    assert_nothing_made(media_root)


def test_it_refuses_a_text_file(client, submit_token, media_root):
    response = post_files(client, submit_token, [("notes.txt", b"just some words\n")])

    assert_refused(response, 415, "notes.txt", "not a PDF")
    assert_nothing_made(media_root)


def test_it_refuses_a_corrupt_pdf(client, submit_token, media_root):
    response = post_files(client, submit_token, [("broken.pdf", corrupt_pdf_bytes())])

    message = assert_refused(response, 400, "broken.pdf", "corrupt")
    assert "encrypted" not in message
    assert_nothing_made(media_root)


def test_it_refuses_an_encrypted_pdf(client, submit_token, media_root):
    response = post_files(client, submit_token, [("secret.pdf", encrypted_pdf_bytes())])

    assert_refused(response, 400, "secret.pdf", "encrypted")
    assert_nothing_made(media_root)


def test_it_refuses_a_pdf_without_pages_and_says_so(client, submit_token, media_root):
    response = post_files(client, submit_token, [("blank.pdf", zero_page_pdf_bytes())])

    message = assert_refused(response, 400, "blank.pdf", "no pages")
    assert "encrypted" not in message
    assert_nothing_made(media_root)


def test_it_refuses_a_file_over_the_size_limit(client, submit_token, media_root, settings):
    settings.OCR_MAX_FILE_BYTES = 1000

    response = post_files(client, submit_token, [("big.pdf", pdf_bytes(PAGES_TRUTH[:1]))])

    assert_refused(response, 413, "big.pdf", "1000 bytes")
    assert_nothing_made(media_root)


def test_it_refuses_a_pdf_over_the_page_limit(client, submit_token, media_root, settings):
    settings.OCR_MAX_PAGES_PER_DOCUMENT = 2

    response = post_files(client, submit_token, [("long.pdf", pdf_bytes())])

    assert_refused(response, 413, "long.pdf", "3 pages", "limit is 2")
    assert_nothing_made(media_root)


def test_it_accepts_a_pdf_at_the_page_limit(client, submit_token, settings):
    settings.OCR_MAX_PAGES_PER_DOCUMENT = 3

    response = post_files(client, submit_token, [("long.pdf", pdf_bytes())])

    assert response.status_code == 201, response.content


def test_it_refuses_an_image_over_the_pixel_limit(client, submit_token, media_root, settings):
    settings.OCR_MAX_IMAGE_PIXELS = 100_000

    response = post_files(client, submit_token, [("huge.png", image_bytes(["a line"]))])

    assert_refused(response, 413, "huge.png", "1400×600", "100000 pixels")
    assert_nothing_made(media_root)


def test_it_refuses_a_tiff_whose_later_frame_is_over_the_pixel_limit(client, submit_token, media_root, settings):
    settings.OCR_MAX_IMAGE_PIXELS = 100_000

    response = post_files(client, submit_token, [("scan.tif", tiff_bytes([(100, 100), (1000, 1000)]))])

    assert_refused(response, 413, "scan.tif", "1000×1000")
    assert_nothing_made(media_root)


def test_it_refuses_a_tiff_of_3000_blank_100_megapixel_frames_for_its_pixels_in_all(client, submit_token, media_root):
    """Review N2: each frame is under the limit a page; the document, summed over its frames, is
    300 gigapixels (a few hundred kilobytes of Group 4), over OCR_MAX_DOCUMENT_PIXELS."""
    response = post_files(client, submit_token, [("blank.tif", blank_tiff_frames(3000))])

    assert_refused(response, 413, "blank.tif", "3000 frames", "300,000,000,000 pixels in all", "a document")
    assert_nothing_made(media_root)


def test_it_refuses_a_pdf_whose_pages_in_all_are_over_the_document_pixel_limit(
    client, submit_token, media_root, settings
):
    settings.OCR_MAX_DOCUMENT_PIXELS = 3_000_000  # a letter page at 200 DPI is 1.87 megapixels

    response = post_files(client, submit_token, [("two.pdf", pdf_bytes([["a"], ["b"]]))])

    assert_refused(response, 413, "two.pdf", "2 pages would render at", "pixels in all")
    assert_nothing_made(media_root)


def test_it_refuses_a_multi_frame_tiff_over_the_page_limit(client, submit_token, media_root, settings):
    settings.OCR_MAX_PAGES_PER_DOCUMENT = 2

    response = post_files(client, submit_token, [("scan.tif", tiff_bytes([(50, 50)] * 3))])

    assert_refused(response, 413, "3 pages")
    assert_nothing_made(media_root)


def test_it_refuses_more_files_than_a_job_may_have(client, submit_token, media_root, settings):
    settings.OCR_MAX_FILES_PER_JOB = 1

    response = post_files(client, submit_token, [("a.png", image_bytes(["a"])), ("b.png", image_bytes(["b"]))])

    assert_refused(response, 413, "2 documents", "limit is 1")
    assert_nothing_made(media_root)


def test_it_refuses_a_request_over_the_request_size_limit(client, submit_token, media_root, settings):
    settings.OCR_MAX_REQUEST_BYTES = 1000

    response = post_files(client, submit_token, [("a.pdf", pdf_bytes(PAGES_TRUTH[:1]))])

    assert_refused(response, 413, "request is larger")
    assert_nothing_made(media_root)


@pytest.mark.parametrize("order", ["good first", "bad first"])
def test_a_good_file_beside_a_bad_one_makes_nothing_at_all(client, submit_token, media_root, order):
    files = [("good.pdf", pdf_bytes()), ("bad.pdf", corrupt_pdf_bytes())]
    if order == "bad first":
        files.reverse()

    response = post_files(client, submit_token, files)

    assert_refused(response, 400, "bad.pdf", "corrupt")
    assert_nothing_made(media_root)


# --- bad fields -----------------------------------------------------------------


def test_it_refuses_an_unknown_pool(client, submit_token, media_root):
    response = post_files(client, submit_token, [("a.pdf", pdf_bytes())], pool="nowhere")

    assert_refused(response, 404, "unknown pool", "nowhere")
    assert_nothing_made(media_root)


@pytest.mark.parametrize("languages", ["eng;rm -rf /", "ENG", "eng+", "../eng"])
def test_it_refuses_malformed_languages(client, submit_token, media_root, languages):
    response = post_files(client, submit_token, [("a.pdf", pdf_bytes())], languages=languages)

    assert_refused(response, 400, "languages must look like")
    assert_nothing_made(media_root)


def test_it_refuses_a_language_that_is_not_installed(client, submit_token, media_root, settings):
    settings.OCR_LANGUAGES = ["eng"]

    response = post_files(client, submit_token, [("a.pdf", pdf_bytes())], languages="eng+deu")

    assert_refused(response, 400, "'deu'", "not available")
    assert_nothing_made(media_root)


def test_it_refuses_a_request_without_files(client, submit_token, media_root):
    response = client.post(URL, {"pool": "local"}, headers={"Authorization": f"Bearer {submit_token}"})

    assert_refused(response, 400, "no files")
    assert_nothing_made(media_root)


def test_it_refuses_a_body_that_is_neither_multipart_nor_json(client, submit_token, media_root):
    response = client.post(
        URL, "files=a.pdf", content_type="text/plain", headers={"Authorization": f"Bearer {submit_token}"}
    )

    assert_refused(response, 415, "multipart/form-data")
    assert_nothing_made(media_root)


def test_a_json_body_carries_urls_only(client, submit_token, media_root):
    response = client.post(
        URL,
        json.dumps({"files": ["a.pdf"]}),
        content_type="application/json",
        headers={"Authorization": f"Bearer {submit_token}"},
    )

    assert_refused(response, 400, "urls")  # the first thing wrong with it: files cannot come as JSON
    assert_nothing_made(media_root)


def test_it_refuses_a_method_it_does_not_serve(client, submit_token):
    response = client.put(URL, b"", headers={"Authorization": f"Bearer {submit_token}"})

    assert_refused(response, 405, "PUT")
    assert response["Allow"] == "GET, POST"


# --- file names -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("sent", "stored"),
    [("../../etc/passwd.pdf", "passwd.pdf"), ("..\\..\\x.pdf", "x.pdf"), ("/etc/x.png.pdf", "x.png.pdf")],
)
def test_a_file_name_with_directories_is_stored_as_a_clean_name_inside_media_root(
    client, submit_token, media_root, tmp_path, sent, stored
):
    body, content_type = raw_multipart([("files", sent, pdf_bytes(PAGES_TRUTH[:1]))])

    response = client.generic(
        "POST", URL, body, content_type=content_type, headers={"Authorization": f"Bearer {submit_token}"}
    )

    assert response.status_code == 201, response.content
    document = Document.objects.get()
    assert document.name == stored
    assert response.json()["documents"][0]["name"] == stored
    written = files_under(tmp_path)
    assert written == [document.source_path]
    assert document.source_path.is_relative_to(media_root)


def test_a_file_name_of_only_dots_gets_a_json_error_and_makes_nothing(client, submit_token, media_root):
    # Django's parser drops such a part and then cannot read the rest of the body.
    body, content_type = raw_multipart([("files", "..", pdf_bytes(PAGES_TRUTH[:1]))])

    response = client.generic(
        "POST", URL, body, content_type=content_type, headers={"Authorization": f"Bearer {submit_token}"}
    )

    assert_refused(response, 400, "multipart body cannot be read")
    assert_nothing_made(media_root)


def test_a_malformed_multipart_body_gets_a_json_error(client, submit_token, media_root):
    response = client.generic(
        "POST",
        URL,
        b"--other\r\nnot a part at all",
        content_type="multipart/form-data; boundary=",
        headers={"Authorization": f"Bearer {submit_token}"},
    )

    assert_refused(response, 400, "multipart body cannot be read")
    assert_nothing_made(media_root)


def test_more_files_than_django_will_parse_get_a_json_error(client, submit_token, media_root, settings):
    settings.DATA_UPLOAD_MAX_NUMBER_FILES = 1

    response = post_files(client, submit_token, [("a.png", image_bytes(["a"])), ("b.png", image_bytes(["b"]))])

    assert_refused(response, 413, "too many files", "limit is 1")
    assert_nothing_made(media_root)


# --- who may submit -------------------------------------------------------------


def test_it_refuses_a_request_without_a_token(client, media_root):
    response = post_files(client, None, [("a.pdf", pdf_bytes())])

    assert_refused(response, 401, "authentication required")
    assert_nothing_made(media_root)


@pytest.mark.parametrize("header", ["Bearer fa_not-a-real-token", "Basic YWxpY2U6cGFzcw==", "Bearer "])
def test_it_refuses_a_bad_token(client, media_root, header, submit_token):
    data = {"files": [SimpleUploadedFile("a.pdf", pdf_bytes(PAGES_TRUTH[:1]))]}

    response = client.post(URL, data, headers={"Authorization": header})

    assert_refused(response, 401)
    assert_nothing_made(media_root)


def test_it_refuses_the_token_of_a_deactivated_user(client, submit_token, ordinary_user, media_root):
    ordinary_user.is_active = False
    ordinary_user.save()

    response = post_files(client, submit_token, [("a.pdf", pdf_bytes(PAGES_TRUTH[:1]))])

    assert_refused(response, 401, "revoked")
    assert_nothing_made(media_root)


def test_a_read_only_token_cannot_submit(client, read_token, media_root):
    response = post_files(client, read_token, [("a.pdf", pdf_bytes(PAGES_TRUTH[:1]))])

    assert_refused(response, 403, "'submit' scope")
    assert_nothing_made(media_root)


def test_a_read_only_token_can_list_jobs(client, read_token, submit_token):
    created = post_files(client, submit_token, [("a.pdf", pdf_bytes(PAGES_TRUTH[:1]))]).json()

    response = client.get(URL, headers={"Authorization": f"Bearer {read_token}"})

    assert response.status_code == 200, response.content
    assert [job["id"] for job in response.json()["jobs"]] == [created["id"]]


def test_a_logged_in_session_can_read_jobs(ordinary_user, submit_token):
    client = Client(enforce_csrf_checks=True)
    created = post_files(client, submit_token, [("a.pdf", pdf_bytes(PAGES_TRUTH[:1]))]).json()
    client.force_login(ordinary_user)

    listing = client.get(URL)
    detail = client.get(f"{URL}/{created['id']}")

    assert listing.status_code == 200
    assert [job["id"] for job in listing.json()["jobs"]] == [created["id"]]
    assert detail.status_code == 200
    assert detail.json()["id"] == created["id"]


def test_a_session_post_without_a_csrf_token_is_refused(ordinary_user, media_root):
    client = Client(enforce_csrf_checks=True)
    client.force_login(ordinary_user)

    response = client.post(URL, {"files": [SimpleUploadedFile("a.pdf", pdf_bytes(PAGES_TRUTH[:1]))]})

    assert_refused(response, 403, "CSRF")
    assert_nothing_made(media_root)


def test_a_session_post_with_the_csrf_token_is_accepted(ordinary_user):
    client = Client(enforce_csrf_checks=True)
    client.force_login(ordinary_user)
    client.get("/jobs/new")  # sets the CSRF cookie, as a browser would get it
    csrf = client.cookies["csrftoken"].value

    response = client.post(
        URL, {"files": [SimpleUploadedFile("a.pdf", pdf_bytes(PAGES_TRUTH[:1]))]}, headers={"X-CSRFToken": csrf}
    )

    assert response.status_code == 201, response.content
    assert Job.objects.get().owner == ordinary_user


def test_a_bad_submission_leaves_earlier_jobs_alone(client, submit_token):
    good = post_files(client, submit_token, [("a.pdf", pdf_bytes(PAGES_TRUTH[:1]))])
    assert good.status_code == 201

    bad = post_files(client, submit_token, [("b.pdf", corrupt_pdf_bytes())])

    assert bad.status_code == 400
    assert list(Job.objects.values_list("pk", flat=True)) == [good.json()["id"]]
    assert Document.objects.count() == 1
    assert Page.objects.count() == 0


def test_a_large_upload_is_hashed_as_it_is_spooled_and_moved_into_place(client, submit_token, settings):
    import hashlib

    from ocrjobs.models import Document

    settings.FILE_UPLOAD_MAX_MEMORY_SIZE = 1000  # spooled to disk, as a scanned PDF of any size is
    content = pdf_bytes()
    assert len(content) > 1000

    response = post_files(client, submit_token, [("scan.pdf", content)])

    assert response.status_code == 201, response.content
    document = Document.objects.get()
    assert document.sha256 == hashlib.sha256(content).hexdigest()
    assert document.source_path.read_bytes() == content


def test_staging_left_by_a_front_that_died_is_removed_after_a_day(media_root, settings):
    # Review L11: nothing swept MEDIA_ROOT/staging; the minute's scaler tick now does.
    import os
    import time

    from pods.tasks import scaler_tick

    staging = settings.MEDIA_ROOT / "staging"
    old, recent = staging / "old", staging / "recent"
    for directory in (old, recent):
        directory.mkdir(parents=True)
        (directory / "0.pdf").write_bytes(b"%PDF-")
    day_ago = time.time() - 24 * 3600 - 60
    os.utime(old, (day_ago, day_ago))

    scaler_tick()

    assert not old.exists() and (recent / "0.pdf").exists()
