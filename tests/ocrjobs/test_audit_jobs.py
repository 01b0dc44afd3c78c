"""The audit record (issue 42) of a job's cancel, retry and rebuild, from each door: the job page,
the API, the admin and the command line; and the job page shows it in the job's timeline."""

from __future__ import annotations

import pytest
from django.core.management import call_command

from ocrjobs.models import Job, Page
from pods.models import AuditEntry
from tests.helpers import auth, only_audit_entry
from tests.ocrjobs.helpers import job_with_pages


@pytest.fixture
def running(ordinary_user, local_pool, queued):
    return job_with_pages(ordinary_user, local_pool, status=Job.Status.RUNNING, pages={"done": 1, "pending": 2})


@pytest.fixture
def partial(ordinary_user, local_pool, queued):
    return job_with_pages(ordinary_user, local_pool, status=Job.Status.PARTIAL, pages={"done": 1, "failed": 2})


def test_a_cancel_from_the_job_page_is_recorded(client, ordinary_user, running):
    client.force_login(ordinary_user)
    client.post(f"/jobs/{running.pk}/cancel")
    entry = only_audit_entry(job=running)
    assert (entry.actor, entry.action, entry.door) == (ordinary_user, "cancel", "page")
    assert entry.detail == "2 pages cancelled, 1 done kept"


def test_a_cancel_from_the_api_is_recorded(client, ordinary_user, submit_token, running):
    assert client.post(f"/v1/jobs/{running.pk}/cancel", headers=auth(submit_token)).status_code == 200
    entry = only_audit_entry(job=running)
    assert (entry.actor, entry.action, entry.door) == (ordinary_user, "cancel", "api")


def test_a_retry_from_the_job_page_and_the_api_is_recorded_each_time(client, ordinary_user, submit_token, partial):
    client.force_login(ordinary_user)
    client.post(f"/jobs/{partial.pk}/retry")
    entry = only_audit_entry(job=partial)
    assert (entry.action, entry.door, entry.detail) == (
        "retry",
        "page",
        "2 failed pages and 0 failed documents queued again",
    )
    Job.objects.filter(pk=partial.pk).update(status=Job.Status.PARTIAL)
    Page.objects.filter(job=partial, status="pending").update(status="failed")
    assert client.post(f"/v1/jobs/{partial.pk}/retry", headers=auth(submit_token)).status_code == 200
    assert list(AuditEntry.objects.filter(job=partial).values_list("door", flat=True)) == ["api", "page"]


def test_a_rebuild_from_the_page_and_the_api_is_recorded(client, ordinary_user, submit_token, partial):
    client.force_login(ordinary_user)
    client.post(f"/jobs/{partial.pk}/outputs/rebuild")
    assert client.post(f"/v1/jobs/{partial.pk}/outputs/rebuild", headers=auth(submit_token)).status_code == 202
    entries = AuditEntry.objects.filter(job=partial).order_by("at", "id")
    assert [(e.action, e.door, e.actor) for e in entries] == [("rebuild", "page", ordinary_user),
                                                              ("rebuild", "api", ordinary_user)]  # fmt: skip


def test_a_refused_retry_leaves_no_entry(client, ordinary_user, running):
    client.force_login(ordinary_user)
    client.post(f"/jobs/{running.pk}/retry")  # running: nothing to retry
    assert not AuditEntry.objects.exists()


def _who(job: Job) -> tuple:
    entry = only_audit_entry(job=job)
    return entry.action, entry.door, entry.actor


def test_the_job_admin_cancels_and_retries_through_the_services(client, admin_user, running, partial):
    client.force_login(admin_user)
    client.post("/admin/ocrjobs/job/", {"action": "cancel", "_selected_action": [running.pk]})
    client.post("/admin/ocrjobs/job/", {"action": "retry", "_selected_action": [partial.pk]})
    assert Job.objects.get(pk=running.pk).status == Job.Status.CANCELLED
    assert Job.objects.get(pk=partial.pk).status == Job.Status.RUNNING
    assert _who(running) == ("cancel", "admin", admin_user)
    assert _who(partial) == ("retry", "admin", admin_user)


def test_the_command_line_cancels_and_retries_with_an_entry_each(ordinary_user, running, partial):
    call_command("job", "cancel", str(running.pk), "--user", "bob")
    call_command("job", "retry", str(partial.pk))
    assert _who(running) == ("cancel", "cli", ordinary_user)
    assert _who(partial) == ("retry", "cli", None)


def test_the_job_page_shows_who_cancelled_it_in_its_timeline(client, ordinary_user, running):
    client.force_login(ordinary_user)
    client.post(f"/jobs/{running.pk}/cancel")
    html = client.get(f"/jobs/{running.pk}").content.decode()
    timeline = html[html.index('id="job-timeline"') :]
    assert "Cancelled by bob" in timeline and "(page)" in timeline and "Submitted" in timeline
