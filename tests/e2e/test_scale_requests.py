"""A scale request on real processes: daphne takes it, ``manage.py workers`` starts it and runs
the passes that carry it on, pods boot on the RunPod simulator."""

from __future__ import annotations

import httpx
import pytest
from django_q.brokers import get_broker

from accounts.models import ApiToken
from pods.models import Pod, Pool, ScaleRequest
from pods.services import lifecycle, passes
from runpodsim import SimConfig, SimulatorThread
from runpodsim.config import GpuTypeConfig
from tests.runpod import use_simulator
from tools.processes import child_env, start_front, start_workers, wait_for

pytestmark = pytest.mark.e2e

GUARD = 120  # seconds, against hangs only
GPU = "NVIDIA SIM 1"
KEY = "scale-key"


@pytest.fixture
def sim(monkeypatch, settings):
    config = SimConfig(
        api_key=KEY, boot_delay_s=0.3, model_load_s=0.2, page_latency_s=0.1,
        gpu_types=[GpuTypeConfig(id=GPU, display_name="sim", secure_price=0.5, capacity={"SECURE": {"DC-1": 8}})],
    )  # fmt: skip
    with SimulatorThread(config) as running:
        use_simulator(running, monkeypatch, settings, api_key=KEY)  # this process and, through child_env, the children
        yield running


def test_a_scale_above_max_parallel_boots_ends_done_at_the_target(
    sim, transactional_db, deployment, tmp_path, admin_user
):
    Pool.objects.create(
        key="sim", provider="runpod", max_pods=8, lanes_per_pod=2, max_parallel_boots=2,
        config={"image": "ghcr.io/example/fleetadmin-pod:1",
                "candidates": [{"gpu_types": [GPU], "cloud_type": "SECURE", "data_centers": ["DC-1"]}]},
    )  # fmt: skip
    headers = {"Authorization": f"Bearer {ApiToken.issue(user=admin_user, name='scale', scopes=['admin'])[1]}"}
    get_broker().purge_queue()
    env = child_env(tmp_path, Q_WORKERS="3")
    workers = start_workers(env, tmp_path)
    front, url = start_front(env, tmp_path)
    try:
        answer = httpx.post(f"{url}/v1/runpod/scale", json={"pool": "sim", "pods": 5, "wait_s": 0}, headers=headers)
        assert answer.status_code == 202, answer.text
        request = ScaleRequest.objects.get(pk=answer.json()["id"])

        def finished() -> bool:
            # The workers' clock asks for a pass while anything is due; until it lands, the test
            # asks where that clock would have (the request, its start and the boots ask on their own).
            passes.pass_request()
            request.refresh_from_db()
            return request.state != ScaleRequest.State.PENDING

        wait_for(finished, GUARD, lambda: f"still pending: {request.result}\n{workers.tail(60)}", interval=0.5)
        detail = httpx.get(f"{url}/v1/runpod/scale/{request.pk}", headers=headers).json()
        assert detail["state"] == "done", detail
        assert detail["result"]["ready"] == 5 and detail["result"]["booting"] == 0
        assert Pod.objects.filter(state=Pod.State.READY).count() == 5
        assert sim.stats()["create_calls"] == 5  # wave after wave, one pod per boot
    finally:
        front.stop()
        workers.stop()
        print(f"--- daphne ---\n{front.tail()}\n--- workers ---\n{workers.tail(80)}")
        for pod in Pod.objects.alive():
            lifecycle.pod_release_now(pod=pod, reason="test over")
