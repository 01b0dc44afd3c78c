"""Fixtures for the ocrjobs tests that send pages to a pod: a pool with one ready pod on the
RunPod simulator (its token in its environment, as a boot puts it), which counts the pages and
documents it received; a hostile HTTP peer; a real S3 server for the documents' storage; a
logged-in client."""

from __future__ import annotations

import ssl
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import pytest
from django.utils import timezone

from pods.models import Pod, Pool, new_pod_token
from pods.providers.base import Offer, PodSpec
from pods.providers.runpod import RunPodProvider
from runpodsim import SimConfig, SimulatorThread
from runpodsim.config import GpuTypeConfig
from tests.runpod import use_simulator
from tools.processes import start_s3_server


@dataclass
class SimPool:
    pool: Pool
    pod: Pod
    sim: SimulatorThread

    def pages_received(self) -> int:
        """Pages the pod read (and answered), whoever sent them."""
        return self.sim.stats()["ocr_pages"]


@contextmanager
def running_sim_pool(monkeypatch, settings, tls: ssl.SSLContext | None = None) -> Iterator[SimPool]:
    """The pool of ``sim_pool``; with ``tls`` (a server context), its pod is reached over TLS at
    https://127.0.0.1:…, as RunPod's proxy serves pods."""
    config = SimConfig(api_key="k", boot_delay_s=0, model_load_s=0, page_latency_s=0.05, default_lanes=2,
                       gpu_types=[GpuTypeConfig(id="G", display_name="g", secure_price=1.0,
                                                capacity={"SECURE": {"DC": 1}})])  # fmt: skip
    with SimulatorThread(config, tls=tls) as sim:
        use_simulator(sim, monkeypatch, settings, api_key="k")
        pool = Pool.objects.create(key="sim", provider="runpod", max_pods=1, lanes_per_pod=2)
        token = new_pod_token()
        spec = PodSpec(name=f"t{uuid.uuid4().hex[:6]}-sim-0", lanes=2, offer=Offer("G", "SECURE", "DC"), image="i:1",
                       env={"POD_TOKEN": token})  # fmt: skip
        created = RunPodProvider(api_key="k", url_template=sim.pod_url_template).create(spec)
        base_url = sim.pod_url_template.format(pod_id=created.provider_id, port=8000)
        if tls is not None:
            base_url = f"https://127.0.0.1:{sim.endpoint.tls_port}/pods/{created.provider_id}"
        pod = Pod.objects.create(
            pool=pool, name=created.name, provider_id=created.provider_id, lanes=2, state=Pod.State.READY,
            base_url=base_url, ready_at=timezone.now(), token=token,
        )  # fmt: skip
        yield SimPool(pool, pod, sim)


@pytest.fixture
def sim_pool(monkeypatch, settings, transactional_db) -> SimPool:
    with running_sim_pool(monkeypatch, settings) as pool:
        yield pool


@pytest.fixture
def cascade(db) -> tuple[Pool, Pool]:
    """A cascade of two local pools: "cheap" (tesseract) escalates pages read below 80 to "strong" (rapidocr)."""
    strong = Pool.objects.create(key="strong", provider="local", max_pods=1, config={"env": {"ENGINE": "rapidocr"}})
    cheap = Pool.objects.create(key="cheap", provider="local", max_pods=1, escalation_pool=strong,
                                escalation_threshold=80)  # fmt: skip
    return cheap, strong


@pytest.fixture
def hostile_peer(settings):
    """``hostile_peer(behaviour)``: a hostile HTTP peer on loopback (tests/hostile.py), which URL
    documents and webhooks may reach (URL_FETCH_ALLOW_PRIVATE), closed after the test."""
    from tests.hostile import HostilePeer

    settings.URL_FETCH_ALLOW_PRIVATE = True
    made = []

    def make(behave) -> HostilePeer:
        made.append(HostilePeer(behave))
        return made[-1]

    yield make
    for server in made:
        server.close()


@pytest.fixture
def bob(client, ordinary_user):
    """The test client, logged in as an ordinary user."""
    client.force_login(ordinary_user)
    return client


def documents_on_s3(settings, env: dict[str, str]) -> None:
    """This process's documents storage pointed at an S3 server, as STORAGE_S3_* in ``env`` do."""
    settings.STORAGES = {
        **settings.STORAGES,
        "documents": {
            "BACKEND": "storages.backends.s3.S3Storage",
            "OPTIONS": {
                "bucket_name": env["STORAGE_S3_BUCKET"],
                "endpoint_url": env["STORAGE_S3_ENDPOINT_URL"],
                "access_key": env["AWS_ACCESS_KEY_ID"],
                "secret_key": env["AWS_SECRET_ACCESS_KEY"],
                "region_name": env["STORAGE_S3_REGION"],
                "addressing_style": env["STORAGE_S3_ADDRESSING_STYLE"],
                "signature_version": "s3v4",
                "default_acl": None,
                "file_overwrite": True,
            },
        },
    }


@pytest.fixture
def s3(tmp_path, settings):
    """The S3 server, and this process's documents storage pointed at it (as STORAGE_S3_* does)."""
    root = tmp_path / "s3"
    server, env = start_s3_server(root, tmp_path)
    documents_on_s3(settings, env)
    yield root / env["STORAGE_S3_BUCKET"], env
    server.stop()
