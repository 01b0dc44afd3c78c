"""The fleet's output shapes live in the API layer (pods/serializers.py); the models keep none."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from decimal import Decimal

from django.apps import apps
from django.utils import timezone

from pods import selectors
from pods.models import Alert, CapacityVerdict, Pod, Pool, ScaleRequest
from pods.serializers import alert_dict, pod_dict, pool_dict, scale_request_dict, verdict_dict

POOL_KEYS = ["key", "name", "provider", "min_pods", "max_pods", "lanes_per_pod", "autostop_seconds"]
POD_KEYS = ["id", "name", "pool", "state", "reason", "provider_id", "lanes", "gpu_type", "data_center", "cost_per_hr",
            "spend", "created_at", "billed_from", "ready_at", "ended_at", "error"]  # fmt: skip
VERDICT_KEYS = ["candidate", "blocked", "remaining_s", "probing", "open", "reason"]
ALERT_KEYS = ["pool", "kind", "message", "count", "since", "last"]
SCALE_REQUEST_KEYS = ["id", "pool", "target", "state", "result", "created_at", "finished_at"]


def test_the_pods_models_keep_no_api_shape():
    shaped = [model.__name__ for model in apps.get_app_config("pods").get_models() if hasattr(model, "to_dict")]

    assert shaped == []


def test_a_pool_and_its_ended_pod_show_in_the_apis_order_and_read_as_json(db):
    now = timezone.now()
    pool = Pool.objects.create(key="gpu", provider="runpod", max_pods=3, lanes_per_pod=2)
    pod = Pod.objects.create(
        pool=pool, name="fa-gpu-1", state=Pod.State.TERMINATED, data_center="", placed_in="EU-RO-1",
        cost_per_hr=Decimal("0.36"), billed_from=now - timedelta(hours=1), ended_at=now, error="gone",
    )  # fmt: skip

    shown_pool, shown_pod = pool_dict(pool), pod_dict(pod)

    assert list(shown_pool) == POOL_KEYS and list(shown_pod) == POD_KEYS
    assert shown_pool["name"] == "gpu"  # a pool without a name shows its key
    assert (shown_pod["pool"], shown_pod["data_center"], shown_pod["spend"]) == ("gpu", "EU-RO-1", 0.36)
    assert shown_pod["ended_at"] == now.isoformat() and shown_pod["ready_at"] is None
    assert pod.token and pod.token not in json.dumps(shown_pod)
    assert json.loads(json.dumps([shown_pool, shown_pod])) == [shown_pool, shown_pod]


def test_a_verdict_shows_as_of_the_moment_it_is_asked(db):
    now = timezone.now()
    verdict = CapacityVerdict.objects.create(
        key="runpod|A40|SECURE|*", blocked_until=now + timedelta(seconds=75.04), reason="no capacity",
        probing_until=now + timedelta(seconds=5), open_until=now - timedelta(seconds=1),
    )  # fmt: skip

    shown = verdict_dict(verdict, now=now)
    later = verdict_dict(verdict, now=now + timedelta(seconds=80))

    assert list(shown) == VERDICT_KEYS
    assert shown == {"candidate": "runpod|A40|SECURE|*", "blocked": True, "remaining_s": 75.0, "probing": True,
                     "open": False, "reason": "no capacity"}  # fmt: skip
    assert (later["blocked"], later["remaining_s"], later["probing"]) == (False, 0.0, False)


def test_an_alert_and_a_scale_request_show_in_the_apis_order(db):
    pool = Pool.objects.create(key="gpu", provider="runpod")
    Alert.raise_(pool=None, kind=Alert.Kind.AUTH, message="refused")
    alert = Alert.raise_(pool=None, kind=Alert.Kind.AUTH, message="refused again")
    alert.refresh_from_db()
    done = ScaleRequest.objects.create(
        pool=pool, target=2, state=ScaleRequest.State.DONE, result={"booted": 2}, finished_at=timezone.now()
    )

    shown_alert, shown_request = alert_dict(alert), scale_request_dict(done)

    assert list(shown_alert) == ALERT_KEYS and list(shown_request) == SCALE_REQUEST_KEYS
    assert (shown_alert["pool"], shown_alert["count"], shown_alert["message"]) == (None, 2, "refused again")
    assert (shown_request["pool"], shown_request["result"]) == ("gpu", {"booted": 2})
    assert shown_request["finished_at"] == done.finished_at.isoformat()


def test_the_fleet_status_is_made_of_these_shapes(fleet):
    status = selectors.fleet_status()

    [gpu] = [pool for pool in status["pools"] if pool["key"] == "gpu"]
    assert list(gpu)[: len(POOL_KEYS)] == POOL_KEYS
    assert {key: gpu[key] for key in POOL_KEYS} == pool_dict(fleet.gpu)
    shown_ready = next(pod for pod in gpu["pod_list"] if pod["id"] == fleet.ready.pk)
    assert list(shown_ready) == [*POD_KEYS, "busy"]
    expected = pod_dict(fleet.ready)
    # (its spend grows by the second: read later here than in the status)
    assert 0 < shown_ready["spend"] <= expected["spend"]
    assert {**shown_ready, "spend": 0} == {**expected, "spend": 0, "busy": shown_ready["busy"]}
    assert status["alerts"] == gpu["alerts"] == [alert_dict(fleet.alert)]
    [verdict] = status["capacity_verdicts"]
    at = datetime.fromisoformat(status["at"])
    assert verdict == verdict_dict(fleet.verdict, now=at)
