"""The simulator's pods stop themselves as the real pod server does (issue 39): EXITED, their GPUs
freed, billing no more, once nobody with their token has asked them anything for AUTOSTOP_SECONDS."""

from __future__ import annotations

import time

import httpx

from runpodsim import SimulatorThread
from runpodsim.farm import Farm
from tests.runpod import pod_client
from tests.runpodsim.test_simulator import GPU, HANG_GUARD, KEY, FakeClock, deploy_query, run, small_config


def test_a_pod_left_alone_for_its_interval_exits_and_stops_billing_at_that_moment() -> None:
    clock = FakeClock()
    farm = Farm(small_config(), clock=clock)
    pod_id = run(farm, deploy_query(POD_TOKEN="t", AUTOSTOP_SECONDS="60"))["podFindAndDeployOnDemand"]["id"]
    pod = farm.pods[pod_id]
    clock.now += 50.0
    farm.touch(pod)  # the control plane asked it something
    clock.now += 59.0
    assert farm.runtime_up(pod) and farm.pod_summary(pod)["billing"]
    clock.now += 2.0
    listed = run(farm, "query { myself { pods { id desiredStatus lastStatusChange runtime { uptimeInSeconds } } } }")
    (seen,) = listed["myself"]["pods"]
    assert seen["desiredStatus"] == "EXITED" and seen["runtime"] is None
    assert "autostop" in seen["lastStatusChange"]
    assert farm.free[(GPU, "SECURE", "EU-RO-1")] == 1  # its GPU is back: nothing bills
    assert farm.pod_summary(pod)["billing"] is False and farm.pod_summary(pod)["autostopped"] is True
    summary = farm.summary()
    assert summary["pods_autostopped"] == 1 and summary["pods_billing"] == 0
    assert not pod.preempted  # its own stop, not the provider taking it back


def test_a_pod_without_an_interval_never_stops_itself() -> None:
    clock = FakeClock()
    farm = Farm(small_config(), clock=clock)
    pod_id = run(farm, deploy_query(POD_TOKEN="t"))["podFindAndDeployOnDemand"]["id"]
    clock.now += 7 * 24 * 3600.0
    assert farm.runtime_up(farm.pods[pod_id])
    assert farm.summary()["pods_autostopped"] == 0


def test_requests_with_its_token_keep_it_up_and_strangers_do_not() -> None:
    config = small_config(boot_delay_s=0.0, model_load_s=0.0, page_latency_s=0.0)
    with SimulatorThread(config) as sim:
        headers = {"Authorization": f"Bearer {KEY}"}
        answer = httpx.post(
            f"{sim.url}/graphql",
            json={"query": deploy_query(POD_TOKEN="t", AUTOSTOP_SECONDS="2")},
            headers=headers,
            timeout=HANG_GUARD,
        )
        pod_id = answer.json()["data"]["podFindAndDeployOnDemand"]["id"]
        url = sim.pod_url_template.format(pod_id=pod_id, port=8000)
        with pod_client(headers={"Authorization": "Bearer t"}) as ours, pod_client() as stranger:
            until = time.monotonic() + 6.0  # three intervals, spoken to with its token
            while time.monotonic() < until:
                assert ours.get(f"{url}/healthz").status_code == 200
                time.sleep(0.2)
            deadline = time.monotonic() + HANG_GUARD  # then only strangers probe it
            while stranger.get(f"{url}/healthz").status_code == 200:
                assert time.monotonic() < deadline, "the pod never stopped itself"
                time.sleep(0.2)
        (pod,) = [p for p in httpx.get(f"{sim.url}/sim/pods", timeout=HANG_GUARD).json()["pods"] if p["id"] == pod_id]
        assert pod["desired_status"] == "EXITED" and pod["billing"] is False and pod["autostopped"] is True
        assert sim.stats()["pods_autostopped"] == 1
