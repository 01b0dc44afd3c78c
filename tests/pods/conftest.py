"""Fixtures for the pods tests: a RunPod simulator and a pool of its GPUs, a deployment prefix of
the test's own for local pods (stopped after it), and the dashboard's fleet."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from pods.models import Pool
from pods.providers.local import LocalProvider
from runpodsim import SimConfig, SimulatorThread
from runpodsim.config import GpuTypeConfig
from tests.pods.dashboard_fixtures import make_fleet
from tests.runpod import use_simulator

KEY = "sim-key"
EMPTY, GOOD = "NVIDIA EMPTY 1", "NVIDIA GOOD 2"


@contextmanager
def simulated(config: SimConfig, monkeypatch, settings) -> Iterator[SimulatorThread]:
    """A simulator of ``config`` that the provider (and the processes a test starts) talks to."""
    with SimulatorThread(config) as simulator:
        use_simulator(simulator, monkeypatch, settings, api_key=KEY)
        settings.RUNPOD_RETRY_DELAYS = (0.01, 0.01)
        settings.DEPLOYMENT_PREFIX = f"t{uuid.uuid4().hex[:6]}"
        yield simulator


@pytest.fixture
def sim(monkeypatch, settings):
    config = SimConfig(
        api_key=KEY,
        boot_delay_s=0.1,
        model_load_s=0.1,
        page_latency_s=0.01,
        gpu_types=[
            GpuTypeConfig(
                id=EMPTY, display_name="empty", secure_price=0.10, capacity={"SECURE": {"EU-RO-1": 0, "US-KS-2": 0}}
            ),  # fmt: skip
            GpuTypeConfig(id=GOOD, display_name="good", secure_price=0.30, capacity={"SECURE": {"EU-RO-1": 3}}),
        ],
    )
    with simulated(config, monkeypatch, settings) as simulator:
        yield simulator


@pytest.fixture
def pool(db):
    return Pool.objects.create(
        key="gpu",
        provider="runpod",
        max_pods=4,
        lanes_per_pod=2,
        config={
            "image": "ghcr.io/example/fleetadmin-pod:1",
            "env": {"MODEL": "olmocr"},
            "candidates": [
                {"gpu_types": [EMPTY, GOOD], "cloud_type": "SECURE", "data_centers": ["EU-RO-1", "US-KS-2"]}
            ],
        },
    )


@pytest.fixture
def prefix(settings, tmp_path):
    settings.VAR_DIR = tmp_path
    settings.DEPLOYMENT_PREFIX = f"t{uuid.uuid4().hex[:6]}"
    yield settings.DEPLOYMENT_PREFIX
    provider = LocalProvider()
    for pod in provider.list(prefix=settings.DEPLOYMENT_PREFIX):
        provider.terminate(pod.provider_id)


@pytest.fixture
def fleet(admin_user, ordinary_user, outsider):
    return make_fleet(admin=admin_user, bob=ordinary_user, mallory=outsider)
