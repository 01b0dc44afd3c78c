"""POST /v1/jobs with an Idempotency-Key: a retry gets the first job, a reused key with another
submission is refused, and two requests racing on one key make one job."""

from __future__ import annotations

import json
import socket
import urllib.parse

import httpx
import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.utils import timezone

from accounts.models import ApiToken
from ocrjobs.models import Document, Job, SubmissionKey
from ocrjobs.services import idempotency
from tests.factories import PAGES_TRUTH, pdf_bytes
from tests.ocrjobs.helpers import files_under, post_json
from tests.ocrjobs.test_submit_api import assert_refused
from tools.processes import child_env, start_front

pytestmark = pytest.mark.usefixtures("local_pool")

URLS = {"urls": ["https://example.org/a.pdf"], "languages": "eng"}


def post_file(client, token: str, content: bytes, key: str, **fields):
    data = {"files": [SimpleUploadedFile("a.pdf", content)], **fields}
    return client.post("/v1/jobs", data, headers={"Authorization": f"Bearer {token}", "Idempotency-Key": key})


def test_a_retry_with_the_same_key_gets_the_first_job_with_200(client, submit_token):
    first = post_json(client, submit_token, URLS, "retry-1")
    again = post_json(client, submit_token, URLS, "retry-1")

    assert first.status_code == 201, first.content
    assert again.status_code == 200, again.content
    assert again.json()["id"] == first.json()["id"]
    assert again["Idempotent-Replayed"] == "true"
    assert Job.objects.count() == 1
    assert Document.objects.count() == 1


def test_a_retried_upload_is_stored_once(client, submit_token, media_root):
    content = pdf_bytes(PAGES_TRUTH[:1])
    first = post_file(client, submit_token, content, "upload-1")
    files_after_first = files_under(media_root)
    again = post_file(client, submit_token, content, "upload-1")

    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json()["id"] == first.json()["id"]
    assert files_under(media_root) == files_after_first


@pytest.mark.parametrize(
    "other", [{**URLS, "languages": "deu"}, {**URLS, "urls": ["https://example.org/b.pdf"]}], ids=["field", "url"]
)
def test_the_same_key_with_a_different_body_is_refused_with_422(client, submit_token, settings, other):
    settings.OCR_LANGUAGES = ["eng", "deu"]
    first = post_json(client, submit_token, URLS, "k")

    response = post_json(client, submit_token, other, "k")

    assert_refused(response, 422, "idempotency-key", "different submission", f"job {first.json()['id']}")
    assert Job.objects.count() == 1


def test_the_same_key_with_a_different_file_is_refused_with_422(client, submit_token, media_root):
    post_file(client, submit_token, pdf_bytes(PAGES_TRUTH[:1]), "file-key")
    files_after_first = files_under(media_root)

    response = post_file(client, submit_token, pdf_bytes(PAGES_TRUTH[:2]), "file-key")

    assert_refused(response, 422, "different submission")
    assert Job.objects.count() == 1
    assert files_under(media_root) == files_after_first


def test_keys_are_per_user(client, submit_token, admin_token):
    mine = post_json(client, submit_token, URLS, "shared")
    theirs = post_json(client, admin_token, URLS, "shared")

    assert (mine.status_code, theirs.status_code) == (201, 201)
    assert mine.json()["id"] != theirs.json()["id"]


def test_a_key_older_than_a_day_makes_a_new_job(client, submit_token):
    first = post_json(client, submit_token, URLS, "old")
    SubmissionKey.objects.update(created_at=timezone.now() - timezone.timedelta(hours=24, minutes=1))

    again = post_json(client, submit_token, {**URLS, "languages": "eng"}, "old")

    assert again.status_code == 201
    assert again.json()["id"] != first.json()["id"]
    assert SubmissionKey.objects.get().job_id == again.json()["id"]


def test_without_a_key_every_post_is_a_new_job(client, submit_token):
    post_json(client, submit_token, URLS, None)
    post_json(client, submit_token, URLS, None)

    assert Job.objects.count() == 2
    assert SubmissionKey.objects.count() == 0


@pytest.mark.parametrize("key", ["", "x" * 256, "caf\u00e9", "two words"])
def test_a_malformed_key_is_refused_with_400(client, submit_token, key):
    response = post_json(client, submit_token, URLS, key)

    assert_refused(response, 400, "idempotency-key")
    assert Job.objects.count() == 0


def test_a_refused_submission_stores_no_key(client, submit_token):
    response = post_json(client, submit_token, {**URLS, "pool": "nowhere"}, "bad-pool")

    assert response.status_code == 404
    assert SubmissionKey.objects.count() == 0
    assert post_json(client, submit_token, URLS, "bad-pool").status_code == 201


def test_the_loser_of_a_race_on_one_key_rolls_back_and_answers_with_the_winners_job(
    client, submit_token, media_root, monkeypatch
):
    """Both requests pass the look-up before either has stored its key (as two fronts would):
    the unique constraint fails the second's insert, and nothing of it is left."""
    content = pdf_bytes(PAGES_TRUTH[:1])
    winner = post_file(client, submit_token, content, "race")
    files_after_winner = files_under(media_root)
    real_lookup = idempotency.submission_key_job
    calls = []

    def lookup_that_misses_once(**kwargs):
        calls.append(kwargs)
        return None if len(calls) == 1 else real_lookup(**kwargs)

    monkeypatch.setattr(idempotency, "submission_key_job", lookup_that_misses_once)

    loser = post_file(client, submit_token, content, "race")

    assert len(calls) == 2  # missed, inserted, failed on the constraint, looked again
    assert loser.status_code == 200, loser.content
    assert loser.json()["id"] == winner.json()["id"]
    assert Job.objects.count() == 1
    assert Document.objects.count() == 1
    assert files_under(media_root) == files_after_winner


def _send_and_drop(url: str, path: str, headers: dict[str, str], body: bytes) -> None:
    """Send a whole request and close the connection without reading a byte of the answer,
    as a client whose connection dropped would."""
    parts = urllib.parse.urlsplit(url)
    head = f"POST {path} HTTP/1.1\r\nHost: {parts.netloc}\r\nContent-Length: {len(body)}\r\n"
    head += "".join(f"{name}: {value}\r\n" for name, value in headers.items()) + "\r\n"
    with socket.create_connection((parts.hostname, parts.port), timeout=10) as connection:
        connection.sendall(head.encode() + body)


def test_a_retry_after_a_dropped_connection_through_daphne_makes_one_job(transactional_db, local_pool, tmp_path):
    from django.contrib.auth.models import User

    user = User.objects.create_user("dropper", password="x")
    token = ApiToken.issue(user=user, name="test", scopes=["submit"])[1]
    front, url = start_front(child_env(tmp_path), tmp_path)
    try:
        headers = {"Authorization": f"Bearer {token}", "Idempotency-Key": "dropped-1",
                   "Content-Type": "application/json"}  # fmt: skip
        body = json.dumps(URLS).encode()

        _send_and_drop(url, "/v1/jobs", headers, body)
        retry = httpx.post(f"{url}/v1/jobs", content=body, headers=headers, timeout=30)
        again = httpx.post(f"{url}/v1/jobs", content=body, headers=headers, timeout=30)
    finally:
        front.stop()

    assert retry.status_code in (200, 201), retry.text  # 201 if the dropped one had not stored its job yet
    assert again.status_code == 200, again.text
    assert again.json()["id"] == retry.json()["id"]
    assert list(Job.objects.values_list("pk", flat=True)) == [retry.json()["id"]], front.tail()
