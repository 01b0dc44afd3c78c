"""Contract tests: RunPodProvider drives the unmodified runpod SDK against the simulator over HTTP.

No test asserts how long anything takes; delays are small and every wait polls
against a generous deadline that only guards against hangs.
"""

from __future__ import annotations

import hashlib
import socket
import time
from collections.abc import Callable, Iterator
from decimal import Decimal
from typing import Any

import httpx
import pytest

from pods.providers import get_provider
from pods.providers.base import AuthFailed, NoCapacity, Offer, PodSpec, Transient, UnknownOffer
from pods.providers.runpod import RunPodProvider, UnsafeValue
from runpodsim import SimConfig, SimulatorThread
from runpodsim.config import GpuTypeConfig
from tests.runpod import pod_request

HANG_GUARD = 30.0
KEY = "test-key"
A5000 = "NVIDIA RTX A5000"
H100 = "NVIDIA H100 80GB HBM3"


def catalogue() -> list[GpuTypeConfig]:
    return [
        GpuTypeConfig(
            id=A5000,
            display_name="RTX A5000",
            secure_price=0.27,
            community_price=0.16,
            capacity={"SECURE": {"EU-RO-1": 2}, "COMMUNITY": {"EU-SE-1": 2}},
        ),
        GpuTypeConfig(
            id=H100,
            display_name="H100 SXM",
            memory_in_gb=80,
            secure_price=2.99,
            capacity={"SECURE": {"US-KS-2": 0, "EU-RO-1": 0}},
        ),
    ]


@pytest.fixture
def sim(monkeypatch: pytest.MonkeyPatch) -> Iterator[SimulatorThread]:
    config = SimConfig(api_key=KEY, boot_delay_s=0.2, model_load_s=0.2, page_latency_s=0.01, gpu_types=catalogue())
    with SimulatorThread(config) as simulator:
        monkeypatch.setenv("RUNPOD_API_BASE_URL", simulator.url)
        yield simulator


@pytest.fixture
def provider(sim: SimulatorThread) -> RunPodProvider:
    return RunPodProvider(api_key=KEY, url_template=sim.pod_url_template, retry_delays=(0.01, 0.01))


def spec(
    name: str = "fa-test-1", *, gpu: str = A5000, cloud: str = "SECURE", dc: str = "EU-RO-1", **kw: Any
) -> PodSpec:
    offer = Offer(gpu_type=gpu, cloud_type=cloud, data_center=dc, cost_per_hr=Decimal("0.27"))
    options: dict[str, Any] = {"lanes": 2, "image": "ghcr.io/example/fleetadmin-pod:1", "ports": "8000/http"}
    options.update(kw)
    return PodSpec(name=name, offer=offer, **options)


def wait_for(what: str, probe: Callable[[], Any]) -> Any:
    deadline = time.monotonic() + HANG_GUARD
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(0.02)
    pytest.fail(f"gave up waiting for {what}")


def wait_serving(provider: RunPodProvider, provider_id: str) -> str:
    seen = wait_for("the pod to run", lambda: (pod := provider.get(provider_id)) and pod.running and pod)
    wait_for("/healthz to say ok", lambda: pod_request("GET", f"{seen.base_url}/healthz").status_code == 200)
    return seen.base_url


def test_catalogue_lists_each_cloud_with_its_price(provider: RunPodProvider) -> None:
    offers = provider.catalogue()

    assert [(o.gpu_type, o.cloud_type, o.cost_per_hr) for o in offers] == [
        (A5000, "COMMUNITY", Decimal("0.16")),
        (A5000, "SECURE", Decimal("0.27")),
        (H100, "SECURE", Decimal("2.99")),
    ]


def test_a_pod_boots_serves_a_page_and_is_terminated(provider: RunPodProvider, sim: SimulatorThread) -> None:
    free_before = sim.stats()["free_capacity"]

    created = provider.create(spec())
    assert not created.running and created.provider_id
    assert sim.stats()["free_capacity"] == free_before - 1

    base_url = wait_serving(provider, created.provider_id)
    # A host of its own, named as RunPod's proxy names pods ({pod_id}-{port}.proxy.runpod.net).
    assert base_url == f"http://{created.provider_id}-8000.proxy.localhost:{sim.endpoint.port}"
    models = pod_request("GET", f"{base_url}/v1/models").json()
    assert models["ready"] is True and models["lanes"] == 2 and models["name"] == "fa-test-1"

    page = b"\x89PNG not really a page"
    answer = pod_request("POST", f"{base_url}/v1/ocr", params={"lang": "eng"}, content=page)
    assert answer.status_code == 200
    assert answer.json()["text"] == f"page {hashlib.sha1(page).hexdigest()[:12]}"

    provider.terminate(created.provider_id)
    assert provider.get(created.provider_id) is None
    assert sim.stats()["free_capacity"] == free_before
    assert pod_request("GET", f"{base_url}/healthz").status_code == 404


def test_a_booting_pod_is_not_running_and_has_no_url(sim: SimulatorThread) -> None:
    slow = RunPodProvider(api_key=KEY, url_template=sim.pod_url_template, retry_delays=())
    sim.set_faults([{"kind": "boot_stuck", "count": 1}])

    created = slow.create(spec())
    seen = slow.get(created.provider_id)

    assert seen is not None and not seen.running and seen.base_url == ""
    assert seen.cost_per_hr == Decimal("0.27")


def test_no_capacity_in_the_data_centre_raises_no_capacity(provider: RunPodProvider, sim: SimulatorThread) -> None:
    with pytest.raises(NoCapacity, match="no longer any instances available"):
        provider.create(spec(gpu=H100, dc="US-KS-2"))

    sim.set_faults([{"kind": "no_capacity", "gpu": A5000, "data_center": "EU-RO-1"}])
    with pytest.raises(NoCapacity):
        provider.create(spec(gpu=A5000, dc="EU-RO-1"))
    assert provider.create(spec("fa-test-2", gpu=A5000, cloud="COMMUNITY", dc="EU-SE-1")).provider_id


def test_capacity_runs_out_after_the_free_gpus_are_taken(provider: RunPodProvider) -> None:
    provider.create(spec("fa-a"))
    provider.create(spec("fa-b"))

    with pytest.raises(NoCapacity):
        provider.create(spec("fa-c"))


def test_unknown_gpu_raises_unknown_offer(provider: RunPodProvider, sim: SimulatorThread) -> None:
    with pytest.raises(UnknownOffer):
        provider.create(spec(gpu="NVIDIA GeForce GTX 480"))
    # One call, the create itself (the SDK's create_pod asked gpuTypes first: a call more, review fix 4).
    assert (sim.stats()["graphql_calls"], sim.stats()["pods_created"]) == (1, 0)


def test_bad_key_raises_auth_failed(sim: SimulatorThread) -> None:
    wrong = RunPodProvider(api_key="not-the-key", url_template=sim.pod_url_template, retry_delays=(0.01,))

    with pytest.raises(AuthFailed):
        wrong.create(spec())
    with pytest.raises(AuthFailed):
        wrong.catalogue()
    assert sim.stats()["pods_created"] == 0


def test_a_revoked_key_raises_auth_failed(provider: RunPodProvider, sim: SimulatorThread) -> None:
    sim.set_faults([{"kind": "bad_key"}])

    with pytest.raises(AuthFailed):
        provider.list(prefix="fa-")


@pytest.mark.parametrize("body", ["text", "json"])
def test_two_5xx_answers_are_retried_and_the_create_succeeds(
    provider: RunPodProvider, sim: SimulatorThread, body: str
) -> None:
    sim.set_faults([{"kind": "http_error", "status": 503, "count": 2, "body": body}])

    created = provider.create(spec())

    assert provider.get(created.provider_id) is not None
    stats = sim.stats()
    assert stats["http_errors_injected"] == 2 and stats["pods_created"] == 1


def test_5xx_past_the_last_retry_raises_transient(provider: RunPodProvider, sim: SimulatorThread) -> None:
    sim.set_faults([{"kind": "http_error", "count": 3}])

    with pytest.raises(Transient):
        provider.catalogue()
    assert sim.stats()["catalogue_calls"] == 3


def test_a_create_whose_answer_was_lost_is_not_made_twice(provider: RunPodProvider, sim: SimulatorThread) -> None:
    sim.set_faults([{"kind": "http_error", "operation": "podFindAndDeployOnDemand", "count": 1, "after_execute": True}])

    created = provider.create(spec("fa-once"))

    pods = sim.pods()
    assert [(p["id"], p["name"]) for p in pods] == [(created.provider_id, "fa-once")]
    assert sim.stats()["create_calls"] == 1


@pytest.mark.parametrize(
    "unsafe",
    [
        {"env": {"TOKEN": 'abc", name: "evil'}},
        {"env": {"NOTE": "two\nlines"}},
        {"env": {"PATH_WIN": "C:\\pods"}},
        {"env": {'BAD"KEY': "x"}},
        {"env": {"ZW": "a\u200bb"}},
        {"name": 'fa-"quoted"'},
        {"image": "img:1 --privileged"},
        {"ports": '8000/http", evil: "1'},
        {"dc": 'EU-RO-1"'},
        {"gpu": 'NVIDIA RTX A5000"'},
    ],
    ids=[
        "env-quote",
        "env-newline",
        "env-backslash",
        "env-key",
        "env-zero-width",
        "name",
        "image",
        "ports",
        "dc",
        "gpu",
    ],
)
def test_unsafe_values_are_refused_before_the_sdk_is_called(
    provider: RunPodProvider, sim: SimulatorThread, unsafe: dict[str, Any]
) -> None:
    calls_before = sim.stats()["graphql_calls"]

    with pytest.raises(UnsafeValue) as refused:
        provider.create(spec(**unsafe))

    assert isinstance(refused.value, ValueError)
    assert sim.stats()["graphql_calls"] == calls_before


def test_a_quote_in_an_env_value_never_reaches_runpod(provider: RunPodProvider, sim: SimulatorThread) -> None:
    before = sim.stats()["graphql_calls"]

    with pytest.raises(ValueError, match="env value of TOKEN"):
        provider.create(spec(env={"TOKEN": 'abc", name: "evil'}))

    assert sim.stats()["graphql_calls"] == before


def test_a_value_its_pattern_refuses_is_not_echoed_in_the_error() -> None:
    # Review L10: the message named the value, which may one day be a secret.
    from pods.providers.runpod import check_pod_id

    with pytest.raises(UnsafeValue) as refused:
        check_pod_id("https://a.example/s3cr3t")

    assert "s3cr3t" not in str(refused.value) and "pod id is not valid here" in str(refused.value)


def test_unsafe_pod_ids_are_refused(provider: RunPodProvider, sim: SimulatorThread) -> None:
    with pytest.raises(UnsafeValue):
        provider.get('abc"}) { id } x: pod(input: {podId: "def')
    with pytest.raises(UnsafeValue):
        provider.terminate("abc\n")
    assert sim.stats()["graphql_calls"] == 0


def test_a_busy_pod_answers_429(provider: RunPodProvider) -> None:
    created = provider.create(spec(lanes=1))
    url = httpx.URL(wait_serving(provider, created.provider_id))
    # A page whose upload has begun holds the only lane until its last byte arrives. The pod's
    # host is a name under .localhost: loopback, the name in the Host header.
    with socket.create_connection(("127.0.0.1", url.port), timeout=HANG_GUARD) as upload:
        head = (f"POST {url.path.rstrip('/')}/v1/ocr HTTP/1.1\r\nHost: {url.host}:{url.port}\r\nContent-Length: 8\r\n"
                "Connection: close\r\n\r\n")  # fmt: skip
        upload.sendall(head.encode() + b"page")
        wait_for("the first page to take the lane",
                 lambda: pod_request("GET", f"{url}/v1/models").json()["busy"] == 1)  # fmt: skip

        second = pod_request("POST", f"{url}/v1/ocr", content=b"page two")

        upload.sendall(b" one")
        first = upload.makefile("rb").readline()
    assert second.status_code == 429 and second.headers["Retry-After"] == "1"
    assert first.startswith(b"HTTP/1.1 200")


def test_list_returns_only_pods_with_the_prefix(provider: RunPodProvider) -> None:
    ours = provider.create(spec("fa-pool-1"))
    provider.create(spec("other-deployment-1", cloud="COMMUNITY", dc="EU-SE-1"))

    listed = provider.list(prefix="fa-")

    assert [(p.provider_id, p.name) for p in listed] == [(ours.provider_id, "fa-pool-1")]
    assert listed[0].age_seconds >= 0


def test_terminating_a_pod_that_is_gone_counts_as_done(provider: RunPodProvider, sim: SimulatorThread) -> None:
    created = provider.create(spec())
    provider.terminate(created.provider_id)

    provider.terminate(created.provider_id)
    provider.terminate("neverexisted01")

    assert sim.stats()["terminate_calls"] == 3


def test_key_and_url_template_come_from_the_settings(sim: SimulatorThread, settings) -> None:
    # Settings read them from the environment at start: tests/test_security.py, in a fresh interpreter.
    settings.RUNPOD_API_KEY = KEY
    settings.RUNPOD_POD_URL_TEMPLATE = "http://{ip}:{public_port}/pods/{pod_id}"

    provider = get_provider("runpod")

    assert isinstance(provider, RunPodProvider)
    created = provider.create(spec())
    assert wait_serving(provider, created.provider_id) == f"{sim.url}/pods/{created.provider_id}"


def test_the_default_url_is_runpods_proxy() -> None:
    provider = RunPodProvider(api_key=KEY)
    pod = {
        "id": "abc123def45678",
        "name": "fa-x",
        "desiredStatus": "RUNNING",
        "ports": "8888/http,22/tcp",
        "costPerHr": 0.44,
        "uptimeSeconds": 12,
        "lastStatusChange": "Rented by User: Tue Dec 16 2025 17:44:56 GMT+0000 (Coordinated Universal Time)",
        "runtime": {"ports": [{"ip": "100.65.0.2", "isIpPublic": False, "privatePort": 8888, "publicPort": 60000}]},
    }

    seen = provider._provider_pod(pod)

    assert provider.url_template == "https://{pod_id}-{port}.proxy.runpod.net"
    assert seen.running and seen.base_url == "https://abc123def45678-8888.proxy.runpod.net"
    assert seen.age_seconds > 12  # measured from lastStatusChange, long ago


def test_an_unreachable_api_is_transient_after_the_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]  # bound but not listening: connections are refused
        monkeypatch.setenv("RUNPOD_API_BASE_URL", f"http://127.0.0.1:{port}")
        provider = RunPodProvider(api_key=KEY, retry_delays=(0.01, 0.01))

        with pytest.raises(Transient, match="unreachable: ConnectError"):
            provider.list(prefix="fa-")
