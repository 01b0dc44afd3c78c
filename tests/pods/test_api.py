"""The fleet's JSON endpoints: /v1/runpod/status and /v1/runpod/prices."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.contrib.auth.models import Group
from django.utils import timezone

from pods import api as pods_api
from pods import selectors
from pods.models import Alert, CapacityVerdict, Pod, Pool, PriceCatalogue
from tests.pods.helpers import api_get


def test_status_needs_credentials(client, db):
    response = api_get(client, "/v1/runpod/status")
    assert response.status_code == 401
    assert "error" in response.json()


def test_status_shows_pools_pods_backlog_alerts_and_verdicts(client, admin_token, local_pool):
    Pod.objects.create(pool=local_pool, name="fa-local-a", state=Pod.State.READY, lanes=2,
                       cost_per_hr=Decimal("0.50"), billed_from=timezone.now())  # fmt: skip
    Pod.objects.create(pool=local_pool, name="fa-local-b", state=Pod.State.BOOTING, lanes=2)
    Pod.objects.create(pool=local_pool, name="fa-local-c", state=Pod.State.TERMINATED, lanes=2)
    Alert.raise_(pool=local_pool, kind=Alert.Kind.AUTH, message="runpod: refused")
    CapacityVerdict.objects.create(key="runpod|H100|SECURE|*", blocked_until=timezone.now() + timezone.timedelta(seconds=60),
                                   reason="no capacity")  # fmt: skip
    from tests.pods.test_pod_services import _pages

    _pages(local_pool, 5)
    body = api_get(client, "/v1/runpod/status", admin_token).json()
    pool = next(p for p in body["pools"] if p["key"] == "local")
    assert pool["pods"] == {"booting": 1, "ready": 1, "draining": 0}
    assert pool["lanes"] == {"used": 0, "total": 2, "claimed": 0}
    assert pool["backlog"] == 5
    assert pool["dollars_per_hour"] == pytest.approx(0.5)
    assert pool["autostop_seconds"] == 600  # its pods stop themselves after this long unspoken to
    assert [a["kind"] for a in pool["alerts"]] == ["auth"]
    assert {p["name"] for p in pool["pod_list"]} == {"fa-local-a", "fa-local-b"}
    [verdict] = body["capacity_verdicts"]
    assert verdict["candidate"] == "runpod|H100|SECURE|*" and verdict["blocked"] and 0 < verdict["remaining_s"] <= 60


def test_status_shows_alerts_only_to_staff_and_admin_tokens(client, read_token, admin_token, local_pool):
    # A deadline alert names another user's job and its deadline (review M2); the dashboard hides
    # alerts from non-staff too.
    Alert.raise_(pool=local_pool, kind=Alert.Kind.DEADLINE, message="job 7's deadline cannot be met")

    ordinary = api_get(client, "/v1/runpod/status", read_token).json()
    staff = api_get(client, "/v1/runpod/status", admin_token).json()

    assert ordinary["alerts"] == [] and all(pool["alerts"] == [] for pool in ordinary["pools"])
    assert [a["message"] for a in staff["alerts"]] == ["job 7's deadline cannot be met"]
    assert {p["key"] for p in ordinary["pools"]} == {p["key"] for p in staff["pools"]}


def test_status_hides_pod_provider_ids_errors_and_closed_pools_from_read_tokens(
    client, ordinary_user, read_token, admin_token, local_pool
):
    # Review N10: a pod's provider id is its RunPod proxy address; its error and end reason are a
    # provider's words; a staff-only pool, or one kept to a group, is not everyone's to see.
    Pod.objects.create(pool=local_pool, name="fa-local-a", state=Pod.State.READY, lanes=2, provider_id="abc123xyz",
                       error="runpod: GPU fell off the bus at 10.0.0.7", reason="boot retried")  # fmt: skip
    Pool.objects.create(key="gpu-staff", provider="local", staff_only=True)
    team = Group.objects.create(name="team")
    Pool.objects.create(key="gpu-team", provider="local").groups.set([team])

    ordinary = api_get(client, "/v1/runpod/status", read_token).json()
    staff = api_get(client, "/v1/runpod/status", admin_token).json()

    assert {p["key"] for p in staff["pools"]} == {"local", "gpu-staff", "gpu-team"}
    assert {p["key"] for p in ordinary["pools"]} == {"local"}
    [staff_pod] = next(p for p in staff["pools"] if p["key"] == "local")["pod_list"]
    [ordinary_pod] = ordinary["pools"][0]["pod_list"]
    assert staff_pod["provider_id"] == "abc123xyz" and staff_pod["error"] and staff_pod["reason"]
    assert ordinary_pod["name"] == "fa-local-a" and ordinary_pod["state"] == "ready"
    assert not {"provider_id", "error", "reason"} & set(ordinary_pod)
    assert b"abc123xyz" not in api_get(client, "/v1/runpod/status", read_token).content

    # In the group, its pool is theirs to see (and still no staff-only one).
    ordinary_user.groups.add(team)
    selectors.fleet_status_snapshot.clear()
    member = api_get(client, "/v1/runpod/status", read_token).json()
    assert {p["key"] for p in member["pools"]} == {"local", "gpu-team"}


def test_prices_without_a_catalogue_asks_a_worker_and_answers_503(client, read_token, queued):
    response = api_get(client, "/v1/runpod/prices", read_token)
    assert response.status_code == 503
    assert queued() == ["pods.tasks.fetch_catalogue"]  # the fetch went to a worker, not done by the front


def test_prices_answers_the_cached_catalogue(client, read_token):
    PriceCatalogue.objects.create(provider="runpod", fetched_at=timezone.now(), offers=[
        {"gpu_type": "H100", "cloud_type": "SECURE", "data_center": "", "cost_per_hr": "2.99"}])  # fmt: skip
    body = api_get(client, "/v1/runpod/prices", read_token).json()
    assert body["offers"] == [{"gpu_type": "H100", "cloud_type": "SECURE", "cost_per_hr": 2.99}]
    assert body["stale"] is False and body["refreshing"] is False


def test_fresh_prices_are_fetched_by_a_worker_and_the_answer_says_when_still_refreshing(
    client, read_token, monkeypatch, queued
):
    monkeypatch.setattr(pods_api, "FRESH_PRICES_WAIT_SECONDS", 0.3)
    minute_ago = timezone.now() - timezone.timedelta(seconds=60)
    PriceCatalogue.objects.create(provider="runpod", fetched_at=minute_ago, offers=[])
    body = api_get(client, "/v1/runpod/prices?fresh=1", read_token).json()
    assert body["refreshing"] is True  # no worker runs in this test: the old list comes back, marked
    assert queued() == ["pods.tasks.fetch_catalogue"]


def test_fresh_prices_asked_again_within_seconds_call_nobody(client, read_token, queued):
    # Review L4: any read token asking fresh again and again made back-to-back provider calls.
    PriceCatalogue.objects.create(provider="runpod", fetched_at=timezone.now() - timezone.timedelta(seconds=2),
                                  offers=[])  # fmt: skip

    bodies = [api_get(client, "/v1/runpod/prices?fresh=1", read_token).json() for _ in range(3)]

    assert [body["refreshing"] for body in bodies] == [False] * 3
    assert queued() == []


def test_unknown_provider_is_404(client, read_token):
    assert api_get(client, "/v1/runpod/prices?provider=aws", read_token).status_code == 404


def test_status_shows_why_dispatch_has_no_lane(client, read_token, local_pool):
    from ocrjobs.models import Dispatcher

    Dispatcher.objects.create(pool=local_pool, token="t1", host="w1", pid=7, note="none healthy (2 booting)")
    body = api_get(client, "/v1/runpod/status", read_token).json()
    pool = next(p for p in body["pools"] if p["key"] == "local")
    assert pool["dispatch"] == {"dispatchers": ["w1:7"], "no_lane_reason": "none healthy (2 booting)"}


# The snapshot is refreshed ahead on a thread of its own: what it shows must be committed.
@pytest.mark.django_db(transaction=True)
def test_status_answers_from_a_snapshot_at_most_a_second_old(client, read_token, local_pool, monkeypatch):
    clock = [1000.0]
    monkeypatch.setattr(selectors.fleet_status_snapshot, "clock", lambda: clock[0])
    computed_before = selectors.fleet_status_snapshot.computations

    def pods_seen() -> set[str]:
        body = api_get(client, "/v1/runpod/status", read_token).json()
        return {p["name"] for p in next(p for p in body["pools"] if p["key"] == "local")["pod_list"]}

    assert pods_seen() == set()
    Pod.objects.create(pool=local_pool, name="fa-local-new", state=Pod.State.BOOTING, lanes=2)
    clock[0] += selectors.STATUS_MAX_AGE_SECONDS
    assert pods_seen() == set()  # the snapshot is exactly max_age old: still served
    clock[0] += 0.01
    assert pods_seen() == {"fa-local-new"}
    assert selectors.fleet_status_snapshot.computations - computed_before == 2
