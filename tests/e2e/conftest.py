from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from django_q.conf import Conf

from fleetadmin.clusters import brokers
from pods.providers.local import LocalProvider
from runpodsim import SimConfig, SimulatorThread
from runpodsim.config import GpuTypeConfig
from runpodsim.runner import pod_url_template
from tests.runpod import use_simulator
from tools.processes import Process, child_env, start_front, start_simulator, start_workers

SIM_GPU = "NVIDIA SIM 1"
# Debian's chromium, driven by Playwright (never `playwright install`).
CHROMIUM = "/usr/bin/chromium"
LAUNCH_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


@dataclass
class LiveSystem:
    url: str
    env: dict[str, str]
    front: Process
    workers: Process

    def logs(self) -> str:
        return f"--- daphne ---\n{self.front.tail()}\n--- qcluster ---\n{self.workers.tail(80)}"


@pytest.fixture
def deployment(settings):
    # A prefix of this test's own, so that its pods are found and stopped whatever happens.
    settings.DEPLOYMENT_PREFIX = f"t{uuid.uuid4().hex[:6]}"
    yield settings.DEPLOYMENT_PREFIX
    provider = LocalProvider()
    for pod in provider.list(prefix=f"{settings.DEPLOYMENT_PREFIX}-"):
        provider.terminate(pod.provider_id)


@pytest.fixture
def live_system_env() -> dict[str, str]:
    """Settings for the live system's children beyond its own; a test parametrizes it to change them."""
    return {}


@pytest.fixture
def live_system(transactional_db, local_pool, deployment, tmp_path, live_system_env):
    """daphne and a qcluster on the test database, with local pods booted on demand."""
    for broker in brokers().values():
        broker.purge_queue()  # nothing left over from earlier tests
    var_dir = tmp_path / "var"
    var_dir.mkdir()
    env = child_env(var_dir, Q_WORKERS="3", **live_system_env)
    workers = start_workers(env, var_dir)
    front, url = start_front(env, var_dir)
    system = LiveSystem(url=url, env=env, front=front, workers=workers)
    yield system
    front.stop()
    workers.stop()
    print(system.logs())
    for log in sorted((var_dir / "pods").glob("*.log")):
        print(f"--- {log.name} ---\n{log.read_text(errors='replace')[-3000:]}")


def queues_of_its_own(monkeypatch, prefix: str) -> str:
    """A django-q2 cluster name of the test's own (``prefix``-…), as this process's too, with every
    queue emptied: on a Redis shared with other runs nobody else takes these tasks, and the tasks
    this process enqueues (a stand-in tick) are signed and queued as the children's are."""
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    monkeypatch.setattr(Conf, "PREFIX", name)
    monkeypatch.setattr(Conf, "CLUSTER_NAME", name)
    for broker in brokers().values():
        broker.purge_queue()
    return name


@contextlib.contextmanager
def system_on_simulator(config: SimConfig, tmp_path, **env: str) -> Iterator[tuple[str, Process, str]]:
    """The RunPod simulator, and daphne and ``manage.py workers`` pointed at it (with ``env``), on the
    test database: yields the front's URL, the workers and the simulator's URL."""
    for broker in brokers().values():
        broker.purge_queue()
    sim, sim_url = start_simulator(config.model_dump(mode="json", by_alias=True), tmp_path)
    env = child_env(tmp_path, RUNPOD_API_BASE_URL=sim_url, RUNPOD_API_KEY=config.api_key,
                    RUNPOD_POD_URL_TEMPLATE=pod_url_template(sim_url), **env)  # fmt: skip
    workers = start_workers(env, tmp_path)
    front, url = start_front(env, tmp_path)
    try:
        yield url, workers, sim_url
    finally:
        front.stop()
        workers.stop()
        sim.stop()
        print(f"--- workers ---\n{workers.tail(150)}\n--- daphne ---\n{front.tail()}")


def simulator(monkeypatch, settings, *, boot_delay_s: float, page_latency_s: float):
    """The RunPod simulator in this process, eight SIM_GPU in one data center, set as the RunPod
    this process and its children (child_env) reach."""
    config = SimConfig(
        api_key="fault-key", boot_delay_s=boot_delay_s, model_load_s=0.2, page_latency_s=page_latency_s,
        gpu_types=[GpuTypeConfig(id=SIM_GPU, display_name="sim", secure_price=0.5, capacity={"SECURE": {"DC-1": 8}})],
    )  # fmt: skip
    with SimulatorThread(config) as running:
        # For this process (reconcile, the stand-in tick) and, through child_env, the children.
        use_simulator(running, monkeypatch, settings, api_key=config.api_key)
        yield running


@pytest.fixture
def sim(monkeypatch, settings):
    yield from simulator(monkeypatch, settings, boot_delay_s=0.2, page_latency_s=0.3)


@pytest.fixture
def browser():
    """A headless chromium for the browser tests (tests/e2e/test_*browser.py)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=LAUNCH_ARGS)
        yield browser
        browser.close()
