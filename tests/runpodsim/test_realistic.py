"""The simulator as hard as RunPod (issue 39): each behaviour a fault mode, and ``realistic()``
turning them all on. The provider's side of each is in tests/pods/test_runpod_fidelity.py."""

from __future__ import annotations

import httpx
import pytest

from runpodsim import SimulatorThread
from runpodsim import graphql as gql
from runpodsim.config import CAPACITY_WORDINGS, SimConfig
from runpodsim.farm import Farm
from tests.runpodsim.test_simulator import GPU, KEY, FakeClock, deploy_query, run, small_config

LIST = "query { myself { pods { id desiredStatus lastStatusChange } } }"


def pod_query(pod_id: str) -> str:
    return f'query {{ pod(input: {{podId: "{pod_id}"}}) {{ id desiredStatus lastStatusChange runtime {{ uptimeInSeconds }} }} }}'


def terminate(pod_id: str) -> str:
    return f'mutation {{ podTerminate(input: {{podId: "{pod_id}"}}) }}'


def test_realistic_turns_on_every_fault_mode_at_a_rate_and_keeps_the_config():
    base = small_config(faults=[{"kind": "boot_stuck", "count": 1}])
    hard = base.realistic(seed=3)
    kinds = {fault.kind for fault in hard.faults}
    modes = {"rate_limit", "http_error", "runtime_null", "null_result", "capacity_wording", "pod_exit", "image_pull"}
    assert modes <= kinds
    assert "boot_stuck" in kinds  # the config's own faults stay
    assert hard.listing_lag_s > 0 and hard.terminated_linger_s > 0 and hard.preempt_terminated_share > 0
    assert [g.id for g in hard.gpu_types] == [g.id for g in base.gpu_types]
    assert all(0 < (f.probability or 0) < 1 for f in hard.faults if f.kind != "boot_stuck")


def test_listing_lags_a_create_and_a_terminate_writes_exited_until_the_pod_is_gone():
    clock = FakeClock()
    farm = Farm(small_config(listing_lag_s=5.0, terminated_linger_s=20.0), clock=clock)
    pod_id = run(farm, deploy_query())["podFindAndDeployOnDemand"]["id"]
    assert run(farm, LIST)["myself"]["pods"] == []  # not listed yet
    assert run(farm, pod_query(pod_id))["pod"]["id"] == pod_id  # its own query answers at once
    clock.now += 6
    assert [p["id"] for p in run(farm, LIST)["myself"]["pods"]] == [pod_id]

    run(farm, terminate(pod_id))
    seen = run(farm, pod_query(pod_id))["pod"]
    assert seen["desiredStatus"] == "EXITED" and seen["lastStatusChange"].startswith("Terminated by user: ")
    assert farm.free[(GPU, "SECURE", "EU-RO-1")] + farm.free[(GPU, "COMMUNITY", "EU-SE-1")] == 2
    clock.now += 6
    assert run(farm, LIST)["myself"]["pods"] == []  # left the listing after the lag
    clock.now += 20
    assert run(farm, pod_query(pod_id))["pod"] is None  # gone after the linger


def test_an_outbid_on_the_terminated_path_leaves_the_listing_and_says_outbid():
    clock = FakeClock()
    farm = Farm(small_config(terminated_linger_s=30.0), clock=clock)
    rent = (
        deploy_query()
        .replace("podFindAndDeployOnDemand(", "podRentInterruptable(")
        .replace("input: {", "input: { bidPerGpu: 0.2,", 1)
    )
    pod_id = run(farm, rent)["podRentInterruptable"]["id"]
    farm.preempt(farm.pods[pod_id], terminated=True)
    assert run(farm, LIST)["myself"]["pods"] == []
    seen = run(farm, pod_query(pod_id))["pod"]
    assert seen["desiredStatus"] == "TERMINATED" and seen["lastStatusChange"].startswith("Outbid: ")


@pytest.mark.parametrize("wording", sorted(CAPACITY_WORDINGS))
def test_no_capacity_comes_in_each_wording_with_its_code(wording):
    farm = Farm(small_config(faults=[{"kind": "capacity_wording", "wording": wording}]))
    run(farm, deploy_query("fa-1"))
    run(farm, deploy_query("fa-2"))
    with pytest.raises(gql.GraphQLError) as raised:
        run(farm, deploy_query("fa-3"))
    assert (str(raised.value), raised.value.code) == CAPACITY_WORDINGS[wording]


def test_a_null_result_creates_nothing_and_a_spending_limit_refuses_with_insufficient_balance():
    farm = Farm(small_config(faults=[{"kind": "null_result", "count": 1}], spending_limit_per_hr=0.2))
    assert run(farm, deploy_query("fa-1")) == {"podFindAndDeployOnDemand": None}
    assert farm.pods == {}
    run(farm, deploy_query("fa-2", cloud="COMMUNITY"))  # $0.16/h
    with pytest.raises(gql.GraphQLError) as raised:
        run(farm, deploy_query("fa-3", cloud="SECURE"))  # $0.27/h more: over $0.20/h
    assert raised.value.code == "INSUFFICIENT_BALANCE"


def test_runpod_stops_pods_itself_with_no_cause_but_the_balance():
    clock = FakeClock()
    farm = Farm(small_config(faults=[{"kind": "pod_exit", "cause": "host", "after_s": 30.0, "count": 1}]), clock=clock)
    host = run(farm, deploy_query("fa-1"))["podFindAndDeployOnDemand"]["id"]
    other = run(farm, deploy_query("fa-2"))["podFindAndDeployOnDemand"]["id"]
    clock.now += 31
    assert run(farm, pod_query(host))["pod"]["lastStatusChange"].startswith("Exited by Runpod: ")
    assert run(farm, pod_query(other))["pod"]["desiredStatus"] == "RUNNING"
    farm.set_balance_empty(True)
    assert "Insufficient balance" in run(farm, pod_query(other))["pod"]["lastStatusChange"]


def test_over_http_a_429_names_its_retry_after_and_the_spot_mutation_can_be_unknown():
    config = small_config(
        faults=[
            {"kind": "rate_limit", "retry_after_s": 4, "body": "text", "count": 1},
            {"kind": "unknown_mutation"},
        ]
    )
    with SimulatorThread(config) as sim:
        headers = {"Authorization": f"Bearer {KEY}"}
        limited = httpx.post(f"{sim.url}/graphql", json={"query": LIST}, headers=headers, timeout=10)
        assert limited.status_code == 429 and limited.headers["Retry-After"] == "4"
        assert limited.headers["Content-Type"].startswith("text/html")
        rent = 'mutation { podRentInterruptable(input: {bidPerGpu: 1, gpuTypeId: "x"}) { id } }'
        refused = httpx.post(f"{sim.url}/graphql", json={"query": rent}, headers=headers, timeout=10).json()
        assert refused["errors"][0]["extensions"]["code"] == "GRAPHQL_VALIDATION_FAILED"
        rest = {
            "name": "fa-r",
            "imageName": "img:1",
            "gpuTypeIds": [GPU],
            "interruptible": True,
            "ports": ["8000/http"],
        }
        created = httpx.post(f"{sim.url}/v1/pods", json=rest, headers=headers, timeout=10)
        assert created.status_code == 201 and created.json()["podType"] == "INTERRUPTABLE"
        assert httpx.post(f"{sim.url}/v1/pods", json=rest, timeout=10).status_code == 401


def test_the_realistic_config_round_trips_through_json(tmp_path):
    path = tmp_path / "sim.json"
    path.write_text(small_config().realistic(seed=1).model_dump_json(by_alias=True))
    assert SimConfig.load(path).listing_lag_s > 0


def test_each_realistic_fault_draws_on_a_seed_of_its_own():
    seeds = [fault.seed for fault in small_config().realistic(seed=2).faults]
    assert None not in seeds and len(set(seeds)) == len(seeds)


def test_an_image_pull_keeps_the_pod_running_without_runtime_for_its_minutes():
    clock = FakeClock()
    farm = Farm(small_config(faults=[{"kind": "image_pull", "pull_s": 240.0, "count": 1}]), clock=clock)
    pod_id = run(farm, deploy_query())["podFindAndDeployOnDemand"]["id"]
    clock.now += 200 + farm.config.boot_delay_s  # well past a boot, still pulling
    seen = run(farm, pod_query(pod_id))["pod"]
    assert seen["desiredStatus"] == "RUNNING" and seen["runtime"] is None
    assert farm.pods[pod_id].holds_gpus  # billed while it pulls, as RunPod bills from the create
    clock.now += 41
    assert run(farm, pod_query(pod_id))["pod"]["runtime"] is not None
    assert farm.summary()["image_pulls_slow"] == 1


def test_a_failed_pull_is_exited_by_runpod_at_its_end_and_is_no_preemption():
    clock = FakeClock()
    farm = Farm(small_config(faults=[{"kind": "image_pull", "pull_s": 60.0, "fails": True}]), clock=clock)
    pod_id = run(farm, deploy_query())["podFindAndDeployOnDemand"]["id"]
    clock.now += 59
    assert run(farm, pod_query(pod_id))["pod"]["desiredStatus"] == "RUNNING"
    clock.now += 2
    seen = run(farm, pod_query(pod_id))["pod"]
    assert seen["desiredStatus"] == "EXITED" and seen["runtime"] is None
    assert seen["lastStatusChange"].startswith("Exited by Runpod: ")
    summary = farm.summary()
    assert (summary["image_pulls_failed"], summary["pods_preempted"], summary["pods_billing"]) == (1, 0, 0)


def test_realistic_pulls_last_minutes_divided_by_its_time_scale():
    pulls = [f for f in small_config().realistic(seed=1).faults if f.kind == "image_pull"]
    assert sorted((f.fails, f.pull_s) for f in pulls) == [(False, 180.0), (True, 60.0)]
    scaled = [f for f in small_config().realistic(seed=1, time_scale=20).faults if f.kind == "image_pull"]
    assert sorted(f.pull_s for f in scaled) == [3.0, 9.0]
    with pytest.raises(ValueError):
        small_config().realistic(time_scale=0)
