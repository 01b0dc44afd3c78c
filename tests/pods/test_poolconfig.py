"""A pool's RunPod settings: checked when the pool is saved, and carried to create_pod by a boot."""

from __future__ import annotations

import pytest

from pods.models import Pod, Pool, pod_name
from pods.poolconfig import PoolConfigError, parse_config
from pods.providers.base import PodOptions
from tests.pods.conftest import EMPTY, GOOD
from tests.pods.helpers import boot_until_settled

BASE = {"image": "ghcr.io/example/fleetadmin-pod:1", "candidates": [{"gpu_types": [GOOD]}]}
SETTINGS = {
    "container_disk_gb": 40,
    "volume_gb": 100,
    "volume_mount_path": "/workspace",
    "network_volume_id": "abc123vol",
    "allowed_cuda_versions": ["12.4", "12.8"],
    "docker_args": "--shm-size 8g",
}


def test_the_pool_settings_become_the_pods_create_options():
    config = parse_config("runpod", {**BASE, **SETTINGS})
    assert config.pod_options() == PodOptions(
        container_disk_gb=40,
        volume_gb=100,
        volume_mount_path="/workspace",
        network_volume_id="abc123vol",
        allowed_cuda_versions=("12.4", "12.8"),
        docker_args="--shm-size 8g",
    )


def test_a_pool_without_them_keeps_runpods_defaults():
    assert parse_config("runpod", BASE).pod_options() == PodOptions()


@pytest.mark.parametrize(
    ("setting", "value", "message"),
    [
        ("container_disk_gb", 0, "container_disk_gb"),
        ("container_disk_gb", "20; rm", "container_disk_gb"),
        ("volume_gb", -1, "volume_gb"),
        ("volume_mount_path", "workspace", "volume_mount_path"),
        ("volume_mount_path", '/w"s', "volume_mount_path"),
        ("network_volume_id", 'vol", name: "x', "network_volume_id"),
        ("allowed_cuda_versions", ["12.4", "latest"], "CUDA version"),
        ("allowed_cuda_versions", "12.4", "allowed_cuda_versions"),
        ("docker_args", 'sh -c "curl evil"', "docker args"),
        ("docker_args", "a\nb", "docker args"),
        ("disk", 20, "disk"),  # not a setting: refused, not ignored
    ],
)
def test_a_bad_setting_is_refused_when_the_pool_is_saved(setting, value, message):
    with pytest.raises(PoolConfigError, match=message):
        parse_config("runpod", {**BASE, setting: value})


def test_a_boot_on_the_simulator_passes_the_pools_settings_to_create_pod(sim, db):
    pool = Pool.objects.create(
        key="gpu",
        provider="runpod",
        max_pods=4,
        lanes_per_pod=2,
        config={**BASE, "candidates": [{"gpu_types": [EMPTY, GOOD], "data_centers": ["EU-RO-1"]}], **SETTINGS},
    )
    pod = Pod.objects.create(pool=pool, name=pod_name(pool, "settings"), lanes=2)

    pod = boot_until_settled(pod.pk)

    assert pod.state == Pod.State.READY, pod.error
    (created,) = [p for p in sim.pods() if p["id"] == pod.provider_id]
    assert created["create_settings"] | {"env_names": []} == {
        "image": BASE["image"],
        "ports": "8000/http",
        "container_disk_gb": 40,
        "registry_auth_id": "",
        "volume_gb": 100,
        "volume_mount_path": "/workspace",
        "network_volume_id": "abc123vol",
        "allowed_cuda_versions": ["12.4", "12.8"],
        "docker_args": "--shm-size 8g",
        "env_names": [],
    }
    assert "LANES" in created["create_settings"]["env_names"]


def test_a_pod_joins_with_the_lanes_it_reports_not_only_the_pools(monkeypatch, settings, db):
    """GPU types differ: a pod image that sizes itself to its GPU reports its lanes in /v1/models."""
    from runpodsim import SimConfig, SimulatorThread
    from runpodsim.config import GpuTypeConfig
    from tests.pods.conftest import KEY
    from tests.runpod import use_simulator

    big = GpuTypeConfig(id="NVIDIA BIG", secure_price=1.0, capacity={"SECURE": {"EU-RO-1": 1}}, pod_lanes=6)
    config = SimConfig(api_key=KEY, boot_delay_s=0.05, model_load_s=0.05, gpu_types=[big])
    with SimulatorThread(config) as sim:
        use_simulator(sim, monkeypatch, settings, api_key=KEY)
        pool = Pool.objects.create(
            key="big", provider="runpod", max_pods=1, lanes_per_pod=2,
            config={"image": BASE["image"], "candidates": [{"gpu_types": ["NVIDIA BIG"]}]},
        )  # fmt: skip
        pod = boot_until_settled(Pod.objects.create(pool=pool, name=pod_name(pool, "big"), lanes=2).pk)

    assert pod.state == Pod.State.READY, pod.error
    assert (pod.lanes, pod.engine["lanes"]) == (6, 6)


def test_a_pods_page_time_limit_stays_under_runpods_proxy_limit(settings):
    from decimal import Decimal

    from pods.providers.base import Offer, PodSpec
    from pods.providers.runpod import create_arguments

    offer = Offer(gpu_type=GOOD, cloud_type="SECURE", data_center="", cost_per_hr=Decimal("1"))
    long = create_arguments(PodSpec(name="fa-x", lanes=2, offer=offer, image="i:1", page_timeout=120.0))
    short = create_arguments(PodSpec(name="fa-x", lanes=2, offer=offer, image="i:1", page_timeout=30.0))
    assert (long["env"]["PAGE_TIMEOUT"], short["env"]["PAGE_TIMEOUT"]) == ("90", "30")


def _mutation(config: dict) -> str:
    """The GraphQL sent to create a pod of a pool with this config."""
    from decimal import Decimal

    from pods.providers.base import Offer, PodSpec
    from pods.providers.runpod import create_query

    options = parse_config("runpod", {**BASE, **config}).pod_options()
    offer = Offer(gpu_type=GOOD, cloud_type="SECURE", data_center="", cost_per_hr=Decimal("1"))
    return create_query(PodSpec(name="fa-x", lanes=2, offer=offer, image="i:1", options=options))


def test_pods_are_created_without_ssh_or_a_public_ip_unless_the_pool_asks(settings):
    settings.RUNPOD_POD_URL_TEMPLATE = "https://{pod_id}-{port}.proxy.runpod.net"

    plain = _mutation({})
    asked = _mutation({"ssh": True, "public_ip": True})

    assert "startSsh: false" in plain and "supportPublicIp: false" in plain
    assert "startSsh: true" in asked and "supportPublicIp: true" in asked


def test_pods_reached_at_their_ip_get_a_public_ip(settings):
    settings.RUNPOD_POD_URL_TEMPLATE = "http://{ip}:{public_port}"

    assert "supportPublicIp: true" in _mutation({})
