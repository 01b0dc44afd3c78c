"""The RunPod simulator on its own: config, GraphQL parsing, fault injection, virtual pods, the command."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import ValidationError
from runpod.api.mutations.pods import generate_pod_deployment_mutation

from runpodsim import SimConfig, SimulatorThread
from runpodsim import graphql as gql
from runpodsim.config import NO_CAPACITY_MESSAGE, NO_GPUS_ON_HOST_MESSAGE, FaultList, GpuTypeConfig
from runpodsim.farm import LOADING, READY, Farm
from runpodsim.schema import RUNPOD_SCHEMA
from tests.runpod import pod_client

REPO = Path(__file__).resolve().parents[2]
HANG_GUARD = 30.0
KEY = "sim-test-key"
GPU = "NVIDIA RTX A5000"


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def small_config(**overrides: Any) -> SimConfig:
    options: dict[str, Any] = {
        "api_key": KEY,
        "boot_delay_s": 10.0,
        "model_load_s": 5.0,
        "gpu_types": [
            GpuTypeConfig(
                id=GPU,
                secure_price=0.27,
                community_price=0.16,
                capacity={"SECURE": {"EU-RO-1": 1}, "COMMUNITY": {"EU-SE-1": 1}},
            )
        ],
    }
    options.update(overrides)
    return SimConfig(**options)


def run(farm: Farm, query: str) -> dict[str, Any]:
    operation = gql.parse(query)
    gql.validate(operation, RUNPOD_SCHEMA)
    return farm.execute(operation)


def deploy_query(name: str = "fa-1", cloud: str = "ALL", dc: str | None = None, **env: str) -> str:
    return generate_pod_deployment_mutation(
        name, "img:1", GPU, cloud, data_center_id=dc, ports="8000/http", env=env or None, container_disk_in_gb=10
    )


# -- config --------------------------------------------------------------------------------------------


def test_config_file_uses_runpods_field_names(tmp_path: Path) -> None:
    path = tmp_path / "sim.json"
    path.write_text(
        json.dumps(
            {
                "api_key": "k",
                "boot_delay_s": 0.5,
                "gpu_types": [
                    {
                        "id": "NVIDIA A40",
                        "displayName": "A40",
                        "memoryInGb": 48,
                        "securePrice": 0.4,
                        "capacity": {"SECURE": {"EU-RO-1": 3}},
                    }
                ],
                "faults": [{"kind": "http_error", "count": 2}, {"kind": "no_capacity", "gpu": "NVIDIA A40"}],
            }
        )
    )

    config = SimConfig.load(path)

    gpu = config.gpu_types[0]
    assert (gpu.display_name, gpu.memory_in_gb, gpu.secure_price, gpu.community_price) == ("A40", 48, 0.4, None)
    assert gpu.capacity == {"SECURE": {"EU-RO-1": 3}}
    assert [fault.kind for fault in config.faults] == ["http_error", "no_capacity"]
    assert config.faults[0].status == 502


@pytest.mark.parametrize(
    "bad",
    [
        {"boot_delay": 1},  # a typo must not be ignored
        {"gpu_types": [{"id": "A"}, {"id": "A"}]},
        {"gpu_types": [{"id": "A", "capacity": {"SECURE": {"EU-RO-1": -1}}}]},
        {"gpu_types": [{"id": "A", "capacity": {"SPOT": {"EU-RO-1": 1}}}]},
        {"faults": [{"kind": "meteor"}]},
        {"faults": [{"kind": "http_error", "status": 302}]},
        {"faults": [{"kind": "slow"}]},
    ],
)
def test_config_refuses_what_it_cannot_honour(bad: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        SimConfig.model_validate(bad)


def test_the_default_config_has_a_catalogue_with_capacity() -> None:
    farm = Farm(SimConfig())

    assert farm.gpus and sum(farm.free.values()) > 0


# -- faults --------------------------------------------------------------------------------------------


def test_a_counted_fault_fires_for_the_next_n_matching_calls_only() -> None:
    fault = FaultList.model_validate({"faults": [{"kind": "http_error", "count": 2, "operation": "pod"}]}).faults[0]

    fired = [fault.fires(op) for op in ("gpuTypes", "pod", "myself", "pod", "pod")]

    assert fired == [False, True, False, True, False]
    assert fault.count == 0


def test_a_seeded_random_fault_repeats_its_pattern() -> None:
    def pattern() -> list[bool]:
        fault = FaultList.model_validate({"faults": [{"kind": "slow", "delay_s": 0, "probability": 0.5, "seed": 7}]})
        return [fault.faults[0].fires("pod") for _ in range(40)]

    first = pattern()

    assert first == pattern()
    assert 0 < sum(first) < 40


def test_no_capacity_fault_blocks_only_what_it_names() -> None:
    farm = Farm(small_config(faults=[{"kind": "no_capacity", "gpu": GPU, "cloud": "COMMUNITY"}]))

    pod = run(farm, deploy_query(cloud="ALL"))["podFindAndDeployOnDemand"]

    assert farm.pods[pod["id"]].cloud == "SECURE"  # the cheaper community machine is blocked
    with pytest.raises(gql.GraphQLError, match="no longer any instances"):
        run(farm, deploy_query("fa-2", cloud="COMMUNITY"))


# -- GraphQL -------------------------------------------------------------------------------------------


def test_the_sdks_deploy_mutation_parses_into_its_input() -> None:
    operation = gql.parse(deploy_query(LANES="3", NOTE="a b"))
    gql.validate(operation, RUNPOD_SCHEMA)

    (field,) = operation.selections
    spec = field.args["input"]
    assert (operation.kind, field.name) == ("mutation", "podFindAndDeployOnDemand")
    assert spec["gpuTypeId"] == GPU and spec["cloudType"] == "ALL" and spec["dataCenterId"] is None
    assert spec["env"] == [{"key": "LANES", "value": "3"}, {"key": "NOTE", "value": "a b"}]


def test_escaped_strings_are_decoded() -> None:
    operation = gql.parse(r'{ pod(input: {podId: "a\"b\\c\u0041"}) { id } }')

    assert operation.selections[0].args["input"]["podId"] == 'a"b\\cA'


@pytest.mark.parametrize(
    ("query", "error"),
    [
        ('{ pod(input: {podId: "abc}) { id } }', "Unterminated string"),
        ('{ pod(input: {podId: "a"b"}) { id } }', "Syntax Error"),
        ('{ pod(input: {podId: "a", podId: "b"}) { id } }', 'only one input field named "podId"'),
        ('{ pod(input: {podId: "a", evil: "b"}) { id } }', 'Field "evil" is not defined'),
        ('{ pod(input: {podId: "a"}) { id secret } }', 'Cannot query field "secret" on type "Pod"'),
        ('{ pod(input: {podId: "a"}) { runtime } }', "must have a selection of subfields"),
        ('{ pod(input: {podId: "a"}) { id name { x } } }', "must not have a selection"),
        ("{ pod { id } }", 'argument "input" of type "PodFilter!" is required'),
        ("{ pod(input: {podId: 12}) { id } }", 'Expected value of type "String"'),
        ("query Q($id: String) { pod(input: {podId: $id}) { id } }", "Variables are not supported"),
        ("mutation { podFindAndDeployOnDemand(input: {cloudType: CHEAP}) { id } }", "does not exist"),
        ("{ gpuTypes { id } } { myself { id } }", "one operation"),
        ("", "Unexpected <EOF>"),
    ],
)
def test_bad_queries_fail_as_a_graphql_server_fails_them(query: str, error: str) -> None:
    with pytest.raises(gql.GraphQLError, match=error):
        gql.validate(gql.parse(query), RUNPOD_SCHEMA)


def test_a_quote_injected_through_an_env_value_breaks_the_query() -> None:
    # What the SDK would send for env={"TOKEN": 'x", name: "evil'} or a lone quote.
    for value in ('x", name: "evil', 'x"'):
        query = deploy_query(TOKEN=value)
        with pytest.raises(gql.GraphQLError):
            gql.validate(gql.parse(query), RUNPOD_SCHEMA)


# -- the farm ------------------------------------------------------------------------------------------


def test_a_pod_boots_loads_and_gives_its_gpu_back() -> None:
    clock = FakeClock()
    farm = Farm(small_config(), clock=clock)

    pod_id = run(farm, deploy_query(cloud="SECURE", LANES="4"))["podFindAndDeployOnDemand"]["id"]
    pod = farm.pods[pod_id]
    query = f'{{ pod(input: {{podId: "{pod_id}"}}) {{ desiredStatus runtime {{ ports {{ privatePort }} }} }} }}'

    assert farm.free[(GPU, "SECURE", "EU-RO-1")] == 0 and pod.lanes == 4
    assert run(farm, query)["pod"] == {"desiredStatus": "RUNNING", "runtime": None}
    clock.now += 10
    assert run(farm, query)["pod"]["runtime"] == {"ports": [{"privatePort": 8000}]}
    assert farm.model_state(pod) == LOADING
    clock.now += 5
    assert farm.model_state(pod) == READY

    assert run(farm, f'mutation {{ podTerminate(input: {{podId: "{pod_id}"}}) }}') == {"podTerminate": None}
    assert farm.free[(GPU, "SECURE", "EU-RO-1")] == 1
    assert run(farm, query)["pod"] is None
    with pytest.raises(gql.GraphQLError, match="not found"):
        run(farm, f'mutation {{ podTerminate(input: {{podId: "{pod_id}"}}) }}')


def test_a_stopped_pod_may_not_get_its_gpu_back() -> None:
    farm = Farm(small_config())
    pod_id = run(farm, deploy_query(cloud="SECURE"))["podFindAndDeployOnDemand"]["id"]
    run(farm, f'mutation {{ podStop(input: {{podId: "{pod_id}"}}) {{ id }} }}')

    run(farm, deploy_query("fa-2", cloud="SECURE"))  # someone else takes the freed GPU

    with pytest.raises(gql.GraphQLError, match=NO_GPUS_ON_HOST_MESSAGE):
        run(farm, f'mutation {{ podResume(input: {{podId: "{pod_id}", gpuCount: 1}}) {{ id }} }}')


def test_unknown_gpu_ids_match_no_gpu_type() -> None:
    farm = Farm(small_config())

    assert run(farm, '{ gpuTypes(input: {id: "NVIDIA GTX 480"}) { id } }') == {"gpuTypes": []}
    assert run(farm, f'{{ gpuTypes(input: {{id: "{GPU}"}}) {{ id securePrice }} }}') == {
        "gpuTypes": [{"id": GPU, "securePrice": 0.27}]
    }


def test_all_clouds_take_the_cheapest_free_machine_until_none_is_left() -> None:
    farm = Farm(small_config())

    first = run(farm, deploy_query("fa-1"))["podFindAndDeployOnDemand"]["id"]
    second = run(farm, deploy_query("fa-2"))["podFindAndDeployOnDemand"]["id"]

    assert (farm.pods[first].cloud, farm.pods[second].cloud) == ("COMMUNITY", "SECURE")
    with pytest.raises(gql.GraphQLError, match=NO_CAPACITY_MESSAGE):
        run(farm, deploy_query("fa-3"))
    assert farm.summary()["no_capacity_answers"] == 1


# -- over HTTP -----------------------------------------------------------------------------------------


@pytest.fixture
def sim() -> Iterator[SimulatorThread]:
    config = small_config(boot_delay_s=0.0, model_load_s=0.0, page_latency_s=0.0, max_page_bytes=1000)
    config.gpu_types[0].capacity["SECURE"]["EU-RO-1"] = 100
    with SimulatorThread(config) as simulator:
        yield simulator


def post(sim: SimulatorThread, query: str, key: str | None = KEY) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.post(f"{sim.url}/graphql", json={"query": query}, headers=headers, timeout=HANG_GUARD)


def test_a_wrong_or_missing_key_gets_401(sim: SimulatorThread) -> None:
    assert post(sim, "{ gpuTypes { id } }", key="wrong").status_code == 401
    assert post(sim, "{ gpuTypes { id } }", key=None).status_code == 401
    assert post(sim, "{ gpuTypes { id } }").status_code == 200
    assert sim.stats()["auth_failures"] == 2


def test_errors_are_answered_with_200_and_an_errors_list(sim: SimulatorThread) -> None:
    answer = post(sim, '{ pod(input: {podId: "x}) { id } }')

    assert answer.status_code == 200
    assert answer.json() == {"errors": [{"message": "Syntax Error: Unterminated string."}]}


def test_injected_5xx_answers_then_recovery(sim: SimulatorThread) -> None:
    sim.set_faults(
        [
            {"kind": "http_error", "status": 503, "count": 1},
            {"kind": "http_error", "status": 500, "count": 1, "body": "json"},
        ]
    )

    gateway = post(sim, "{ gpuTypes { id } }")
    json_error = post(sim, "{ gpuTypes { id } }")
    healthy = post(sim, "{ gpuTypes { id } }")

    assert gateway.status_code == 503 and gateway.headers["Content-Type"].startswith("text/html")
    assert json_error.status_code == 500 and "Something went wrong" in json_error.json()["errors"][0]["message"]
    assert healthy.status_code == 200 and healthy.json()["data"]["gpuTypes"] == [{"id": GPU}]
    assert [fault["count"] for fault in httpx.get(f"{sim.url}/sim/faults").json()["faults"]] == [0, 0]


def test_a_slow_fault_still_answers(sim: SimulatorThread) -> None:
    sim.set_faults([{"kind": "slow", "delay_s": 0.05, "count": 1}])

    assert post(sim, "{ myself { pods { id } } }").json() == {"data": {"myself": {"pods": []}}}


def test_faults_and_capacity_can_be_changed_at_run_time(sim: SimulatorThread) -> None:
    bad = httpx.post(f"{sim.url}/sim/faults", json={"faults": [{"kind": "meteor"}]})
    assert bad.status_code == 400

    sim.set_faults([{"kind": "bad_key"}])
    assert post(sim, "{ gpuTypes { id } }").status_code == 401
    assert sim.set_faults([{"kind": "slow", "delay_s": 0}], append=True)[-1]["kind"] == "slow"
    sim.set_faults([])
    sim.set_capacity(GPU, "SECURE", "EU-RO-1", 0)
    sim.set_capacity(GPU, "COMMUNITY", "EU-SE-1", 0)

    answer = post(sim, deploy_query())

    assert answer.json()["errors"][0]["message"] == NO_CAPACITY_MESSAGE


def test_a_hundred_pods_are_served_by_one_process(sim: SimulatorThread) -> None:
    with httpx.Client(base_url=sim.url, headers={"Authorization": f"Bearer {KEY}"}, timeout=HANG_GUARD) as client:
        created = [client.post("/graphql", json={"query": deploy_query(f"fa-{i}", cloud="SECURE")}) for i in range(100)]
        ids = [answer.json()["data"]["podFindAndDeployOnDemand"]["id"] for answer in created]
        statuses = {client.get(f"/pods/{pod_id}/healthz").status_code for pod_id in ids}
        texts = {client.post(f"/pods/{pod_id}/v1/ocr", content=pod_id.encode()).json()["text"] for pod_id in ids}

    assert statuses == {200}
    assert len(texts) == 100
    stats = sim.stats()
    assert (stats["pods_running"], stats["ocr_pages"], stats["create_calls"]) == (100, 100, 100)


def test_each_pod_answers_at_a_host_of_its_own_as_at_runpods_proxy_and_under_the_gateway(sim: SimulatorThread) -> None:
    ids = [post(sim, deploy_query(f"fa-{n}", cloud="SECURE")).json()["data"]["podFindAndDeployOnDemand"]["id"]
           for n in range(2)]  # fmt: skip
    own = [sim.pod_url_template.format(pod_id=pod_id, port=8000) for pod_id in ids]

    assert own[0] == f"http://{ids[0]}-8000.proxy.localhost:{sim.endpoint.port}"
    with pod_client() as client:
        texts = [client.post(f"{url}/v1/ocr", content=b"page").json()["text"] for url in own]
        assert client.get(f"{own[1]}/v1/models").json()["name"] == "fa-1"
        assert client.get(f"http://{ids[0]}-9000.proxy.localhost:{sim.endpoint.port}/healthz").status_code == 404
        assert client.get(f"http://nosuchpod-8000.proxy.localhost:{sim.endpoint.port}/healthz").status_code == 404
    # The same pods under the simulator's one host, as behind one gateway.
    assert httpx.get(f"{sim.url}/pods/{ids[1]}/v1/models").json()["name"] == "fa-1"
    assert texts[0] == texts[1] and sim.stats()["ocr_pages"] == 2
    assert [pod["pages_done"] for pod in sim.pods()] == [1, 1]


def test_the_gateway_mode_announces_every_pod_under_the_simulators_one_host() -> None:
    with SimulatorThread(small_config(gateway=True)) as sim:
        assert sim.pod_url_template == f"{sim.url}/pods/{{pod_id}}"
        assert sim.endpoint.environment()["RUNPOD_POD_URL_TEMPLATE"] == sim.pod_url_template


def test_virtual_pods_refuse_like_the_pod_server(sim: SimulatorThread) -> None:
    pod_id = post(sim, deploy_query(cloud="SECURE")).json()["data"]["podFindAndDeployOnDemand"]["id"]
    base = f"{sim.url}/pods/{pod_id}"

    assert httpx.get(f"{sim.url}/pods/nosuchpod/healthz").status_code == 404
    assert httpx.post(f"{base}/v1/ocr", content=b"x" * 1001).status_code == 413
    assert httpx.post(f"{base}/v1/ocr", content=b"").status_code == 400
    assert httpx.post(f"{base}/v1/ocr", params={"lang": "klingon"}, content=b"x").status_code == 400
    assert httpx.get(f"{base}/v1/models").json()["lanes"] == 1


def test_a_pod_with_a_failed_model_says_so(sim: SimulatorThread) -> None:
    sim.set_faults([{"kind": "model_fail", "count": 1}])
    pod_id = post(sim, deploy_query(cloud="SECURE")).json()["data"]["podFindAndDeployOnDemand"]["id"]

    answer = httpx.get(f"{sim.url}/pods/{pod_id}/healthz")

    assert answer.status_code == 503 and answer.json()["status"] == "failed"
    assert httpx.post(f"{sim.url}/pods/{pod_id}/v1/ocr", content=b"x").status_code == 503


def test_a_booting_pod_is_not_reachable_yet() -> None:
    with SimulatorThread(small_config(boot_delay_s=3600)) as sim:
        pod_id = post(sim, deploy_query(cloud="SECURE")).json()["data"]["podFindAndDeployOnDemand"]["id"]

        assert httpx.get(f"{sim.url}/pods/{pod_id}/healthz").status_code == 502
        assert sim.pods()[0]["runtime_up"] is False


# -- the management command ----------------------------------------------------------------------------


def test_the_command_serves_until_terminated(tmp_path: Path) -> None:
    config = tmp_path / "sim.json"
    config.write_text(json.dumps({"api_key": KEY, "gpu_types": [{"id": "NVIDIA L4", "communityPrice": 0.2}]}))
    process = subprocess.Popen(
        [sys.executable, "manage.py", "runpodsim", "--port", "0", "--config", str(config)],
        cwd=REPO,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        lines: queue.Queue[str] = queue.Queue()
        assert process.stdout is not None
        threading.Thread(target=lambda: lines.put(process.stdout.readline()), daemon=True).start()
        first = lines.get(timeout=HANG_GUARD)
        assert first.startswith("RUNPODSIM http://127.0.0.1:"), first
        url = first.split()[1]

        answer = httpx.post(
            f"{url}/graphql", json={"query": "{ gpuTypes { id } }"}, headers={"Authorization": f"Bearer {KEY}"}
        )
        assert answer.json() == {"data": {"gpuTypes": [{"id": "NVIDIA L4"}]}}

        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=HANG_GUARD) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        if process.stdout:
            process.stdout.close()


def test_the_command_refuses_a_bad_config(tmp_path: Path) -> None:
    config = tmp_path / "sim.json"
    config.write_text(json.dumps({"boot_delay": 1}))

    done = subprocess.run(
        [sys.executable, "manage.py", "runpodsim", "--config", str(config)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=HANG_GUARD,
    )

    assert done.returncode != 0 and "boot_delay" in done.stderr


# -- virtual pods' document cache and token ------------------------------------------------------


def png_like(n: int, size: int = 100) -> bytes:
    """A body the pod counts as a one-page PNG (the simulator reads no pixels)."""
    head = b"\x89PNG\r\n\x1a\n" + str(n).encode()
    return head + b"\0" * (size - len(head))


def sha(body: bytes) -> str:
    import hashlib

    return hashlib.sha256(body).hexdigest()


@pytest.fixture
def small_cache() -> Iterator[SimulatorThread]:
    config = small_config(boot_delay_s=0.0, model_load_s=0.0, page_latency_s=0.0, document_cache_bytes=250,
                          max_document_bytes=150)  # fmt: skip
    with SimulatorThread(config) as simulator:
        yield simulator


def test_a_virtual_pod_keeps_documents_and_answers_409_for_one_it_lacks(small_cache: SimulatorThread) -> None:
    sim = small_cache
    pod_id = post(sim, deploy_query(cloud="SECURE")).json()["data"]["podFindAndDeployOnDemand"]["id"]
    base = f"{sim.url}/pods/{pod_id}"
    body = png_like(1)
    ask = {"document": sha(body), "page": 1, "dpi": 200, "languages": "eng"}

    missing = httpx.post(f"{base}/v1/ocr", json=ask)
    assert (missing.status_code, missing.json()) == (409, {"error": "document not cached", "document": sha(body)})
    assert httpx.put(f"{base}/v1/documents/{sha(b'other')}", content=body).status_code == 400  # not its hash
    assert httpx.put(f"{base}/v1/documents/NOTHEX", content=body).status_code == 400
    assert httpx.put(f"{base}/v1/documents/{sha(b'x' * 151)}", content=b"x" * 151).status_code == 413
    stored = httpx.put(f"{base}/v1/documents/{sha(body)}", content=body)
    again = httpx.put(f"{base}/v1/documents/{sha(body)}", content=body)
    assert (stored.status_code, again.status_code) == (201, 200)
    assert stored.json() == {"sha256": sha(body), "bytes": 100, "pages": 1}
    page = httpx.post(f"{base}/v1/ocr", json=ask)
    assert page.status_code == 200 and "render_seconds" in page.json()
    assert httpx.post(f"{base}/v1/ocr", json={**ask, "page": 2}).status_code == 400  # out of range

    stats = sim.stats()
    assert (stats["ocr_not_cached_answers"], stats["documents_received"], stats["documents_already_cached"]) == (
        1,
        1,
        1,
    )
    assert stats["document_bytes_received"] == stats["bytes_to_pods"] == 300  # every body read, the bad one too
    assert httpx.get(f"{base}/v1/models").json()["documents"] == {"count": 1, "bytes": 100, "capacity_bytes": 250}


def test_every_put_checks_a_documents_bytes_against_its_name(small_cache: SimulatorThread) -> None:
    # A body already checked (by any virtual pod) is compared byte for byte rather than hashed
    # again (256 pods hash on the simulator's one core): a tampered copy under its name is refused.
    sim = small_cache
    pod_id = post(sim, deploy_query(cloud="SECURE")).json()["data"]["podFindAndDeployOnDemand"]["id"]
    base = f"{sim.url}/pods/{pod_id}"
    body = png_like(7)

    first = httpx.put(f"{base}/v1/documents/{sha(body)}", content=body)
    forged = httpx.put(f"{base}/v1/documents/{sha(body)}", content=body[:-1] + b"\1")
    short = httpx.put(f"{base}/v1/documents/{sha(body)}", content=body[:-1])
    again = httpx.put(f"{base}/v1/documents/{sha(body)}", content=body)

    assert (first.status_code, again.status_code) == (201, 200)
    assert (forged.status_code, forged.json()) == (400, {"error": "the body's sha256 is not its name"})
    assert short.status_code == 400


def test_a_virtual_pods_cache_evicts_the_least_recently_used_document(small_cache: SimulatorThread) -> None:
    sim = small_cache
    pod_id = post(sim, deploy_query(cloud="SECURE")).json()["data"]["podFindAndDeployOnDemand"]["id"]
    base = f"{sim.url}/pods/{pod_id}"
    first, second, third = png_like(1), png_like(2), png_like(3)
    for body in (first, second):
        httpx.put(f"{base}/v1/documents/{sha(body)}", content=body).raise_for_status()
    # Reading a page of the first makes it the most recently used: the second goes instead.
    httpx.post(f"{base}/v1/ocr", json={"document": sha(first), "page": 1}).raise_for_status()
    httpx.put(f"{base}/v1/documents/{sha(third)}", content=third).raise_for_status()

    assert [d["sha256"] for d in sim.pod_documents(pod_id)] == [sha(first), sha(third)]
    assert httpx.post(f"{base}/v1/ocr", json={"document": sha(second), "page": 1}).status_code == 409


def test_a_virtual_pod_with_a_token_answers_only_with_it(sim: SimulatorThread) -> None:
    token = "t" * 43
    pod_id = post(sim, deploy_query(cloud="SECURE", POD_TOKEN=token)).json()["data"]["podFindAndDeployOnDemand"]["id"]
    base = f"{sim.url}/pods/{pod_id}"
    good, wrong = {"Authorization": f"Bearer {token}"}, {"Authorization": "Bearer nope"}

    assert httpx.get(f"{base}/healthz").status_code == 200  # health needs no token
    assert httpx.get(f"{base}/v1/models").status_code == 401
    assert httpx.get(f"{base}/v1/models", headers=wrong).status_code == 401
    assert httpx.put(f"{base}/v1/documents/{sha(b'x')}", content=b"x", headers=wrong).status_code == 401
    assert httpx.post(f"{base}/v1/ocr", content=b"x", headers=wrong).status_code == 401
    refused = httpx.post(f"{base}/v1/ocr", content=b"x")
    assert token not in refused.text
    assert httpx.get(f"{base}/v1/models", headers=good).status_code == 200
    assert httpx.post(f"{base}/v1/ocr", content=b"x", headers=good).status_code == 200

    stats = sim.stats()
    assert stats["pod_auth_failures"] == 5
    assert (stats["document_bytes_received"], stats["image_bytes_received"]) == (0, 1)  # refused bodies unread
