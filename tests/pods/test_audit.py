"""The audit record (issue 42): every release and terminate of a pod asked by a person, from the
dashboard, the API, the admin and the command line, leaves who, which door and when; the system's
own releases (a shed) leave none; the pod admin is read-only and its actions go through the
services."""

from __future__ import annotations

import json
from decimal import Decimal

import pytest
from django.core.management import call_command
from django.utils import timezone

from pods.models import AuditEntry, Pod
from pods.services import lifecycle
from tests.helpers import auth, only_audit_entry


@pytest.fixture
def ready_pod(local_pool, queued):
    now = timezone.now()
    return Pod.objects.create(pool=local_pool, name="t-audit-1", provider_id="pid-1", state=Pod.State.READY,
                              lanes=2, cost_per_hr=Decimal("0"), billed_from=now, ready_at=now,
                              base_url="http://127.0.0.1:9")  # fmt: skip


def test_a_release_from_the_dashboard_records_who_released_the_pod(client, admin_user, ready_pod):
    client.force_login(admin_user)
    assert client.post(f"/pods/{ready_pod.pk}/release").status_code == 302
    entry = only_audit_entry(pod=ready_pod)
    assert (entry.actor, entry.actor_name, entry.action, entry.door) == (admin_user, "alice", "release", "page")
    # a second press finds it ended: nothing more is recorded
    client.post(f"/pods/{ready_pod.pk}/release")
    assert AuditEntry.objects.filter(pod=ready_pod).count() == 1


def test_a_release_from_the_api_records_the_tokens_user(client, admin_user, admin_token, ready_pod):
    response = client.post("/v1/runpod/release", json.dumps({"pod_id": ready_pod.pk, "reason": "too slow"}),
                           content_type="application/json", headers=auth(admin_token))  # fmt: skip
    assert response.status_code == 200
    entry = only_audit_entry(pod=ready_pod)
    assert (entry.actor, entry.action, entry.door, entry.detail) == (admin_user, "release", "api", "too slow")


def test_the_pod_admin_releases_through_the_service_and_records_it(client, admin_user, ready_pod):
    client.force_login(admin_user)
    response = client.post("/admin/pods/pod/", {"action": "release", "_selected_action": [ready_pod.pk]})
    assert response.status_code == 302
    ready_pod.refresh_from_db()
    assert ready_pod.state == Pod.State.TERMINATED and ready_pod.terminate_pending  # as pod_release leaves it
    entry = only_audit_entry(pod=ready_pod)
    assert (entry.actor, entry.action, entry.door) == (admin_user, "release", "admin")


def test_the_pod_admin_terminates_an_ended_pod_at_the_provider_again(client, admin_user, ready_pod):
    ready_pod.mark_ended(Pod.State.FAILED, error="boot failed")
    Pod.objects.filter(pk=ready_pod.pk).update(terminate_pending=False)
    client.force_login(admin_user)
    client.post("/admin/pods/pod/", {"action": "terminate", "_selected_action": [ready_pod.pk]})
    ready_pod.refresh_from_db()
    assert ready_pod.terminate_pending  # the next pass terminates it at the provider
    entry = only_audit_entry(pod=ready_pod)
    assert (entry.action, entry.door) == ("terminate", "admin")


def test_the_pod_admin_is_read_only(client, admin_user, ready_pod):
    client.force_login(admin_user)
    page = client.get(f"/admin/pods/pod/{ready_pod.pk}/change/")
    assert page.status_code == 200
    html = page.content.decode()
    assert 'name="state"' not in html and 'name="base_url"' not in html and 'name="task_lease_token"' not in html
    before = Pod.objects.filter(pk=ready_pod.pk).values("state", "base_url").get()
    client.post(f"/admin/pods/pod/{ready_pod.pk}/change/", {"state": "draining", "base_url": "http://evil"})
    assert Pod.objects.filter(pk=ready_pod.pk).values("state", "base_url").get() == before
    assert client.get("/admin/pods/pod/add/").status_code == 403
    assert client.post(f"/admin/pods/pod/{ready_pod.pk}/delete/", {"post": "yes"}).status_code == 403
    assert Pod.objects.filter(pk=ready_pod.pk).exists()
    actions = client.get("/admin/pods/pod/").content.decode()
    assert 'value="release"' in actions and 'value="terminate"' in actions and "delete_selected" not in actions


def test_the_pods_admin_page_shows_its_audit_entries(client, admin_user, ready_pod):
    client.force_login(admin_user)
    client.post("/admin/pods/pod/", {"action": "release", "_selected_action": [ready_pod.pk]})
    html = client.get(f"/admin/pods/pod/{ready_pod.pk}/change/").content.decode()
    assert "alice" in html and "release" in html and "admin: alice" in html


def test_a_release_from_the_command_line_records_the_user_named(admin_user, ready_pod):
    call_command("pod", "release", str(ready_pod.pk), "--user", "alice", "--reason", "maintenance")
    entry = only_audit_entry(pod=ready_pod)
    assert (entry.actor, entry.action, entry.door, entry.detail) == (admin_user, "release", "cli", "maintenance")


def test_a_release_from_the_command_line_without_a_user_names_the_shell_user(ready_pod):
    call_command("pod", "terminate", str(ready_pod.pk))
    entry = only_audit_entry(pod=ready_pod)
    assert entry.actor is None and entry.actor_name.endswith("(shell)") and entry.door == "cli"


def test_the_systems_own_releases_leave_no_entry(ready_pod):
    assert lifecycle.pod_release(pod=ready_pod, reason="shed: idle")
    assert not AuditEntry.objects.exists()
