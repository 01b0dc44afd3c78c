"""The control API: scale, release, spend, models."""

from __future__ import annotations

import json
import threading
import uuid
from decimal import Decimal

import pytest
from django.utils import timezone

from pods import tasks
from pods.models import Pod, Pool, ScaleRequest, SpendEntry
from pods.services import lifecycle, passes
from tests.pods.helpers import api_get, boot_until_settled
from tools.processes import wait_for


def _post(client, path, body, token, content_type="application/json"):
    data = body if isinstance(body, (str, bytes)) else json.dumps(body)
    return client.post(path, data=data, content_type=content_type, HTTP_AUTHORIZATION=f"Bearer {token}")


@pytest.mark.parametrize(
    ("body", "status", "words"),
    [
        ("{not json", 400, "json"),
        ({"pool": "local", "pods": "3"}, 400, "pods"),
        ({"pool": "local", "pods": 1, "delta": 1}, 400, "exactly one"),
        ({"pool": "local"}, 400, "exactly one"),
        ({"pool": "local", "pods": -1}, 400, "pods"),
        ({"pool": "local", "pods": 50}, 400, "at most"),
        ({"pool": "local", "delta": -5}, 400, "cannot have"),
        ({"pool": "nope", "pods": 1}, 404, "unknown pool"),
        ({"pool": "local", "pods": 1, "extra": True}, 400, "extra"),
    ],
)
def test_scale_refuses_bad_requests_and_makes_nothing(client, admin_token, local_pool, body, status, words, queued):
    response = _post(client, "/v1/runpod/scale", body, admin_token)
    assert response.status_code == status
    assert words in response.json()["error"].lower()
    assert ScaleRequest.objects.count() == 0 and queued() == []


def test_scale_needs_the_admin_scope(client, submit_token, local_pool):
    assert _post(client, "/v1/runpod/scale", {"pool": "local", "pods": 1}, submit_token).status_code == 403
    assert client.post("/v1/runpod/scale", data="{}", content_type="application/json").status_code == 401
    assert _post(client, "/v1/runpod/scale", "pool=local", submit_token, "text/plain").status_code in (403, 415)


def test_scale_answers_pending_with_an_id_then_the_result(client, transactional_db, settings, tmp_path, queued):
    from django.contrib.auth import get_user_model

    from accounts.models import ApiToken
    from pods.models import Pool

    Pool.objects.get_or_create(key="local", defaults={"provider": "local", "max_pods": 1, "lanes_per_pod": 1})
    admin = get_user_model().objects.create_user("ops", password="x", is_staff=True)
    _, token = ApiToken.issue(user=admin, name="t", scopes=["admin"])
    settings.VAR_DIR = tmp_path
    settings.DEPLOYMENT_PREFIX = f"t{uuid.uuid4().hex[:6]}"
    response = _post(client, "/v1/runpod/scale", {"pool": "local", "pods": 1, "wait_s": 0}, token)
    assert response.status_code == 202
    body = response.json()
    assert body["state"] == "pending" and body["url"] == f"/v1/runpod/scale/{body['id']}"
    # A short task starts it (the floor, one tick), passes carry it on: none waits in a worker.
    assert queued() == ["pods.tasks.scale_pool", "pods.tasks.advance_pods"]
    try:
        tasks.scale_pool(body["id"])  # what a worker does with the first
        pod = Pod.objects.get(state=Pod.State.BOOTING)
        boot_until_settled(pod.pk)  # what passes do with the boot it started
        passes.pass_run()  # what a worker does with the second
        detail = api_get(client, body["url"], token).json()
        assert detail["state"] == "done", detail
        assert detail["result"]["ready"] == 1 and detail["result"]["booted"] == 1
    finally:
        for pod in Pod.objects.alive():
            lifecycle.pod_release_now(pod=pod, reason="test over")
    assert api_get(client, "/v1/runpod/scale/999999", token).status_code == 404


def test_scale_waits_for_the_result_on_the_row_and_answers_it_within_wait_s(
    client, transactional_db, admin_token, local_pool
):
    def worker() -> None:  # a worker starts it and a pass finds it done, while the front waits
        from django.db import connection

        request = wait_for(lambda: ScaleRequest.objects.first(), 30, "no scale request stored")
        tasks.scale_pool(request.pk)
        passes.pass_run()
        connection.close()

    thread = threading.Thread(target=worker)
    thread.start()
    try:
        response = _post(client, "/v1/runpod/scale", {"pool": "local", "pods": 0, "wait_s": 60}, admin_token)
    finally:
        thread.join(timeout=60)
    assert response.status_code == 200
    assert response.json()["state"] == "done" and response.json()["result"]["ready"] == 0


def test_release_is_admin_only_idempotent_and_attributes_spend_first(
    client, admin_token, submit_token, local_pool, django_capture_on_commit_callbacks, queued
):
    pod = Pod.objects.create(pool=local_pool, name="fa-local-rel", state=Pod.State.READY, provider_id="999999999",
                             cost_per_hr=Decimal("3.60"), billed_from=timezone.now() - timezone.timedelta(seconds=10))  # fmt: skip
    assert _post(client, "/v1/runpod/release", {"pod_id": pod.pk}, submit_token).status_code == 403
    assert _post(client, "/v1/runpod/release", {"pod_id": 424242}, admin_token).status_code == 404
    assert _post(client, "/v1/runpod/release", {"pod_id": "x"}, admin_token).status_code == 400

    with django_capture_on_commit_callbacks(execute=True):
        first = _post(client, "/v1/runpod/release", {"pod_id": pod.pk}, admin_token)
    assert first.status_code == 200 and first.json()["released"] is True
    assert first.json()["pod"]["state"] == "terminated"
    assert SpendEntry.objects.filter(pod=pod).count() == 1
    assert queued() == ["pods.tasks.advance_pods"]  # the provider side: a pass (tests/pods/test_releases.py)

    again = _post(client, "/v1/runpod/release", {"pod_id": pod.pk}, admin_token)
    assert again.status_code == 200 and again.json() == {**again.json(), "released": False, "already_ended": True}
    assert SpendEntry.objects.filter(pod=pod).count() == 1 and len(queued()) == 1


def test_spend_reports_by_pool_pod_and_job_and_refuses_a_bad_since(client, read_token, local_pool):
    Pod.objects.create(pool=local_pool, name="fa-local-live", state=Pod.State.READY, cost_per_hr=Decimal("3.60"),
                       billed_from=timezone.now() - timezone.timedelta(seconds=100))  # fmt: skip
    body = api_get(client, "/v1/runpod/spend", read_token).json()
    assert body["dollars_per_hour"] == pytest.approx(3.6)
    assert body["by_pool"]["local"] == pytest.approx(0.1, rel=0.05)
    assert "fa-local-live" in body["by_pod"]
    since = (timezone.now() - timezone.timedelta(seconds=10)).isoformat()
    recent = client.get("/v1/runpod/spend", {"since": since}, HTTP_AUTHORIZATION=f"Bearer {read_token}").json()
    assert recent["by_pool"]["local"] == pytest.approx(0.01, rel=0.2)
    assert api_get(client, "/v1/runpod/spend?since=yesterday", read_token).status_code == 400


def test_spend_by_job_shows_a_non_staff_caller_only_their_own_jobs(client, read_token, admin_token, ordinary_user,
                                                                   outsider, local_pool):  # fmt: skip
    from ocrjobs.models import Job

    pod = Pod.objects.create(pool=local_pool, name="fa-local-ended", state=Pod.State.TERMINATED)
    jobs = {user: Job.objects.create(owner=user, pool=local_pool) for user in (ordinary_user, outsider)}
    for job in jobs.values():
        SpendEntry.objects.create(
            pod=pod, pool=local_pool, job=job, dollars=Decimal("0.25"), seconds=10, at=timezone.now()
        )
    SpendEntry.objects.create(pod=pod, pool=local_pool, job=None, dollars=Decimal("0.5"), seconds=30, at=timezone.now())

    own = api_get(client, "/v1/runpod/spend", read_token).json()
    everyone = api_get(client, "/v1/runpod/spend", admin_token).json()

    assert own["by_job"] == {str(jobs[ordinary_user].pk): 0.25}
    assert everyone["by_job"] == {str(job.pk): 0.25 for job in jobs.values()}
    assert own["by_pool"] == everyone["by_pool"] == {"local": 1.0}  # the fleet's costs are the same for all
    assert own["by_pod"] == {"fa-local-ended": 1.0}


def test_spend_names_no_pool_or_pod_a_read_token_may_not_use(client, read_token, admin_token, local_pool):
    # Review N10: a staff-only pool's key and its pods' names are not shown to others; the
    # fleet's totals stay the same for all.
    staff_pool = Pool.objects.create(key="gpu-staff", provider="local", staff_only=True)
    for pool, name in ((local_pool, "fa-local-a"), (staff_pool, "fa-gpu-staff-a")):
        pod = Pod.objects.create(pool=pool, name=name, state=Pod.State.TERMINATED)
        SpendEntry.objects.create(pod=pod, pool=pool, dollars=Decimal("0.5"), seconds=30, at=timezone.now())

    own = api_get(client, "/v1/runpod/spend", read_token).json()
    everyone = api_get(client, "/v1/runpod/spend", admin_token).json()

    assert everyone["by_pool"] == {"gpu-staff": 0.5, "local": 0.5}
    assert everyone["by_pod"] == {"fa-gpu-staff-a": 0.5, "fa-local-a": 0.5}
    assert own["by_pool"] == {"local": 0.5} and own["by_pod"] == {"fa-local-a": 0.5}
    assert own["total"] == everyone["total"] == 1.0


def test_models_lists_what_ready_pods_reported(client, read_token, local_pool):
    Pod.objects.create(pool=local_pool, name="fa-local-m", state=Pod.State.READY, lanes=2,
                       engine={"engine": "tesseract", "version": "5.3.0", "languages": ["eng"], "ready": True})  # fmt: skip
    body = api_get(client, "/v1/models", read_token).json()
    [pool] = [p for p in body["pools"] if p["pool"] == "local"]
    assert pool["models"] == [{"engine": "tesseract", "version": "5.3.0", "languages": ["eng"], "pods": 1, "lanes": 2}]


def test_models_shows_read_tokens_only_the_pools_open_to_them(client, read_token, admin_token, local_pool):
    # Review N10: a staff-only pool (a GPU or vlm pool) is not listed to a user who cannot use it.
    Pool.objects.create(key="vlm-staff", provider="local", staff_only=True)
    ordinary = api_get(client, "/v1/models", read_token).json()
    staff = api_get(client, "/v1/models", admin_token).json()
    assert {p["pool"] for p in ordinary["pools"]} == {"local"}
    assert {p["pool"] for p in staff["pools"]} == {"local", "vlm-staff"}


def test_a_scale_request_is_shown_to_staff_and_admin_tokens_only(client, read_token, admin_token, local_pool):
    # Review N10: scaling is asked with an admin token; its result carries boot errors.
    request = ScaleRequest.objects.create(pool=local_pool, target=1, requested_by="ops",
                                          result={"errors": ["runpod: out of H100 at 10.0.0.7"]})  # fmt: skip
    refused = api_get(client, f"/v1/runpod/scale/{request.pk}", read_token)
    assert refused.status_code == 404 and refused.json() == {"error": f"no scale request {request.pk}"}
    assert api_get(client, f"/v1/runpod/scale/{request.pk}", admin_token).json()["target"] == 1
