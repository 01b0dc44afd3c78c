"""The simulator's interruptible pods: bid prices in its catalogue, podRentInterruptable, preemptions."""

from __future__ import annotations

import threading
import time
from decimal import Decimal

import httpx
import pytest

from pods.providers.base import Offer, PodSpec
from pods.providers.runpod import interruptible_query
from runpodsim import SimulatorThread
from runpodsim import graphql as gql
from runpodsim.config import GpuTypeConfig
from runpodsim.farm import Farm
from tests.runpod import pod_client
from tests.runpodsim.test_simulator import GPU, KEY, FakeClock, deploy_query, run, small_config

PRICES = "query { gpuTypes { id lowestPrice(input: {gpuCount: 1}) { minimumBidPrice uninterruptablePrice } } }"


def rent_query(bid: str, name: str = "fa-spot-1") -> str:
    offer = Offer(GPU, "SECURE", "EU-RO-1", cost_per_hr=Decimal(bid), interruptible=True)
    return interruptible_query(PodSpec(name=name, lanes=2, offer=offer, image="img:1", env={"POD_TOKEN": "t"}))


def test_the_catalogue_names_a_minimum_bid_configured_or_derived_from_each_clouds_price() -> None:
    gpus = [
        GpuTypeConfig(id="A", secure_price=0.5, community_price=0.3),
        GpuTypeConfig(id="B", secure_price=0.5, minimum_bid_price=0.11),
        GpuTypeConfig(id="C", secure_price=0.5),  # no bid configured: 60 % of the secure price
        GpuTypeConfig(id="D", secure_price=0.5, community_price=0.3, secure_minimum_bid_price=0.4),
    ]
    farm = Farm(small_config(gpu_types=gpus))
    bids = {gpu["id"]: gpu["lowestPrice"]["minimumBidPrice"] for gpu in run(farm, PRICES)["gpuTypes"]}
    assert bids == {"A": pytest.approx(0.18), "B": pytest.approx(0.11), "C": pytest.approx(0.3), "D": 0.18}
    per_cloud = (
        "query { gpuTypes { id secureSpotPrice communitySpotPrice "
        "s: lowestPrice(input: {gpuCount: 1, secureCloud: true}) { minimumBidPrice } "
        "c: lowestPrice(input: {gpuCount: 1, secureCloud: false}) { minimumBidPrice } } }"
    )
    d = next(gpu for gpu in run(farm, per_cloud)["gpuTypes"] if gpu["id"] == "D")
    assert (d["secureSpotPrice"], d["communitySpotPrice"]) == (0.4, pytest.approx(0.18))
    assert (d["s"]["minimumBidPrice"], d["c"]["minimumBidPrice"]) == (0.4, pytest.approx(0.18))


def test_a_secure_bid_is_held_to_the_secure_clouds_minimum_not_the_communitys() -> None:
    farm = Farm(small_config())  # secure 0.27: its minimum bid 0.162; community 0.16: 0.096
    with pytest.raises(gql.GraphQLError, match="below the minimum bid"):
        run(farm, rent_query("0.1"))  # over the community's minimum, under the secure cloud's
    assert run(farm, rent_query("0.17"))["podRentInterruptable"]["costPerHr"] == pytest.approx(0.17)


def test_a_pod_is_rented_at_its_bid_and_a_bid_under_the_minimum_is_refused() -> None:
    farm = Farm(small_config())  # secure 0.27: minimum bid 0.162
    with pytest.raises(gql.GraphQLError, match="below the minimum bid"):
        run(farm, rent_query("0.05"))
    pod = run(farm, rent_query("0.17"))["podRentInterruptable"]
    assert pod["costPerHr"] == pytest.approx(0.17)
    listed = farm.pods[pod["id"]]
    assert listed.interruptible and farm.pod_dict(listed)["podType"] == "INTERRUPTABLE"
    assert farm.summary()["bids_refused"] == 1


def test_preemptions_come_at_the_configured_rate_on_the_simulators_clock_the_same_with_a_seed() -> None:
    def moments(seed: int) -> list[float]:
        clock = FakeClock()
        gpus = [GpuTypeConfig(id=GPU, secure_price=0.27, community_price=0.16, capacity={"SECURE": {"EU-RO-1": 400}})]
        farm = Farm(small_config(gpu_types=gpus, preempt_rate_per_hour=0.5, preempt_seed=seed), clock=clock)
        for n in range(200):
            run(farm, rent_query("0.17", name=f"fa-spot-{n}"))
        return [pod.preempt_at - clock.now for pod in farm.pods.values()]

    first = moments(7)
    assert first == moments(7)  # deterministic with a seed
    assert first != moments(8)
    mean_hours = sum(first) / len(first) / 3600
    assert 1.4 < mean_hours < 2.8  # exponential with mean 1 / 0.5 per hour = 2 h (200 draws)


def test_a_preempted_pod_stops_gives_its_gpu_back_and_stays_listed_until_terminated() -> None:
    clock = FakeClock()
    farm = Farm(small_config(preempt_rate_per_hour=1.0, preempt_seed=1), clock=clock)
    pod_id = run(farm, rent_query("0.17"))["podRentInterruptable"]["id"]
    pod = farm.pods[pod_id]
    clock.now += 20.0
    assert farm.runtime_up(pod)
    clock.now = pod.preempt_at + 1.0
    listed = run(farm, "query { myself { pods { id desiredStatus runtime { uptimeInSeconds } } } }")
    assert listed["myself"]["pods"] == [{"id": pod_id, "desiredStatus": "EXITED", "runtime": None}]
    assert farm.free[(GPU, "SECURE", "EU-RO-1")] == 1
    assert farm.summary()["pods_preempted"] == 1
    assert farm.pod_dict(pod)["lastStatusChange"].startswith("Outbid: ")


def test_on_demand_pods_are_never_preempted() -> None:
    clock = FakeClock()
    farm = Farm(small_config(preempt_rate_per_hour=3600.0, preempt_seed=1), clock=clock)
    created = run(farm, deploy_query())
    clock.now += 3600.0
    assert farm.runtime_up(farm.pods[created["podFindAndDeployOnDemand"]["id"]])
    assert farm.summary()["pods_preempted"] == 0


def test_a_page_in_flight_when_its_pod_is_preempted_is_answered_502_and_not_counted_done() -> None:
    config = small_config(boot_delay_s=0.0, model_load_s=0.0, page_latency_s=0.5)
    with SimulatorThread(config) as sim:
        headers = {"Authorization": f"Bearer {KEY}"}
        answer = httpx.post(f"{sim.url}/graphql", json={"query": rent_query("0.17")}, headers=headers, timeout=10)
        pod_id = answer.json()["data"]["podRentInterruptable"]["id"]
        url = sim.pod_url_template.format(pod_id=pod_id, port=8000)
        with pod_client(headers={"Authorization": "Bearer t"}) as client:
            result: dict = {}
            page = threading.Thread(target=lambda: result.update(r=client.post(f"{url}/v1/ocr", content=b"\x89PNG..")))
            page.start()
            time.sleep(0.2)
            sim.preempt(pod_id)
            page.join(timeout=10)
            assert result["r"].status_code == 502
            assert client.get(f"{url}/healthz").status_code == 502
        stats = sim.stats()
        assert stats["interruptible_create_calls"] == 1
        assert stats["ocr_pages"] == 0 and stats["ocr_pages_lost_to_preemption"] == 1
        assert httpx.post(f"{sim.url}/sim/preempt", json={"pod_id": "nope"}, timeout=10).status_code == 404
