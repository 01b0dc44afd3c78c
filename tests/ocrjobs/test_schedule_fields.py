"""A job's budget, deadline and priority, set from the API (JSON and multipart), the form and the
command line, checked the same way everywhere."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from zoneinfo import ZoneInfo

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.core.management import call_command
from django.utils import timezone

from ocrjobs.models import Job
from tests.factories import PAGES_TRUTH, pdf_bytes
from tests.ocrjobs.helpers import assert_nothing_made, post_json
from tests.ocrjobs.test_submit_api import assert_refused

pytestmark = pytest.mark.usefixtures("local_pool")

SOON = (timezone.now() + timezone.timedelta(hours=2)).replace(microsecond=0)


URLS = {"urls": ["https://example.org/a.pdf"]}


def test_json_sets_budget_and_deadline(client, submit_token):
    response = post_json(
        client, submit_token, {**URLS, "max_dollars": 12.5, "deadline": SOON.isoformat().replace("+00:00", "Z")}
    )

    assert response.status_code == 201, response.content
    job = Job.objects.get()
    assert job.max_dollars == Decimal("12.50") and job.deadline == SOON
    body = response.json()
    assert (body["max_dollars"], body["deadline"], body["priority"]) == (12.5, SOON.isoformat(), "balanced")


def test_multipart_sets_budget_and_priority(client, submit_token):
    upload = SimpleUploadedFile("a.pdf", pdf_bytes(PAGES_TRUTH[:1]))
    response = client.post("/v1/jobs", {"files": [upload], "max_dollars": "3", "priority": "cheapest"},
                           headers={"Authorization": f"Bearer {submit_token}"})  # fmt: skip

    assert response.status_code == 201, response.content
    job = Job.objects.get()
    assert (job.max_dollars, job.priority, job.deadline) == (Decimal("3.00"), "cheapest", None)


@pytest.mark.parametrize(
    "fields, words",
    [
        ({"max_dollars": -1}, ["max_dollars", "more than 0"]),
        ({"max_dollars": 0}, ["max_dollars", "more than 0"]),
        ({"max_dollars": 1.234}, ["two decimal places"]),
        ({"max_dollars": "5"}, ["max_dollars"]),
        ({"max_dollars": True}, ["max_dollars"]),
        ({"deadline": "tomorrow"}, ["deadline", "iso 8601"]),
        ({"deadline": "2026-12-01T14:00:00"}, ["time zone"]),
        ({"deadline": "2000-01-01T00:00:00Z"}, ["in the past"]),
        ({"deadline": "2099-01-01T00:00:00Z"}, ["30 days"]),
        ({"priority": "urgent"}, ["priority"]),
        ({"priority": "fastest", "deadline": SOON.isoformat()}, ["not both"]),
    ],
)
def test_a_bad_budget_deadline_or_priority_is_a_400(client, submit_token, media_root, fields, words):
    assert_refused(post_json(client, submit_token, {**URLS, **fields}), 400, *words)
    assert_nothing_made(media_root)


def test_the_form_sets_them_and_shows_their_errors(client, ordinary_user, media_root):
    client.force_login(ordinary_user)
    upload = SimpleUploadedFile("a.pdf", pdf_bytes(PAGES_TRUTH[:1]))

    # (the date-time picker sends no time zone: the site's is taken)
    refused = client.post("/jobs/new", {"files": [upload], "pool": "local", "languages": "eng",
                                        "deadline": "2026-12-01T14:00"})  # fmt: skip
    assert refused.status_code == 400 and "in the past" in refused.content.decode()
    assert Job.objects.count() == 0

    upload = SimpleUploadedFile("a.pdf", pdf_bytes(PAGES_TRUTH[:1]))
    accepted = client.post("/jobs/new", {"files": [upload], "pool": "local", "languages": "eng",
                                         "max_dollars": "4.25", "deadline": SOON.isoformat()})  # fmt: skip
    assert accepted.status_code == 302, accepted.content.decode()[-2000:]
    job = Job.objects.get()
    assert (job.max_dollars, job.deadline, job.priority) == (Decimal("4.25"), SOON, "balanced")


def test_the_forms_date_time_picker_is_read_in_the_sites_time_zone(client, ordinary_user, settings):
    settings.TIME_ZONE = "Europe/Berlin"
    client.force_login(ordinary_user)
    moment = (timezone.now() + timedelta(days=1)).astimezone(ZoneInfo("Europe/Berlin")).replace(second=0, microsecond=0)
    upload = SimpleUploadedFile("a.pdf", pdf_bytes(PAGES_TRUTH[:1]))

    response = client.post("/jobs/new", {"files": [upload], "pool": "local", "languages": "eng",
                                         "deadline": moment.strftime("%Y-%m-%dT%H:%M")})  # fmt: skip

    assert response.status_code == 302
    assert Job.objects.get().deadline == moment


def test_the_command_line_refuses_a_bad_deadline_with_exit_2(tmp_path, media_root, capsys):
    document = tmp_path / "a.pdf"
    document.write_bytes(pdf_bytes(PAGES_TRUTH[:1]))

    with pytest.raises(SystemExit) as exited:
        call_command("ocr", str(document), "--deadline", "soon", "--out", str(tmp_path / "out"))

    assert exited.value.code == 2
    assert "deadline must be an ISO 8601 time" in capsys.readouterr().err
    assert_nothing_made(media_root)


def test_the_command_line_sets_budget_and_priority(tmp_path, monkeypatch):
    from ocrjobs.management.commands import ocr

    document = tmp_path / "a.pdf"
    document.write_bytes(pdf_bytes(PAGES_TRUTH[:1]))
    monkeypatch.setattr(ocr.Command, "follow", lambda self, job, timeout: False)  # no fleet to wait for

    with pytest.raises(SystemExit) as exited:
        call_command("ocr", str(document), "--max-dollars", "2.5", "--priority", "fastest", "--out", str(tmp_path))

    assert exited.value.code == 4
    job = Job.objects.get()
    assert (job.max_dollars, job.priority) == (Decimal("2.50"), "fastest")
