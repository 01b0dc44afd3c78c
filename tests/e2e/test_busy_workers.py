"""Workers that never wait (issue 11, invariant 15): a one-page job is not held up by boots.

Real daphne, ``manage.py workers`` (default sizes: 4 short-task workers) and the RunPod simulator,
whose pods take minutes to come up. A scale request asks for 8 RunPod pods; then a one-page job
goes to the local tesseract pool. Boots that slept in django-q2 workers held all four short-task
workers (three boots and the scale request) until the first wave came up, and the job's split
waited behind them: the issue measured 181 s against 3.6 s idle. With boots as rows that passes
advance, the job is done while every boot is still in flight.

Nothing here measures time: the job must be done while the boots are still booting. The
simulator's boot delay (BOOT_DELAY_S) only makes "still booting" last long enough for a job that
nothing holds up, on a loaded machine too.
"""

from __future__ import annotations

import uuid

import httpx
import pytest

from accounts.models import ApiToken
from ocrjobs.models import Job
from pods.models import Pod, Pool
from runpodsim import SimConfig
from runpodsim.config import GpuTypeConfig
from tests.e2e.conftest import system_on_simulator
from tests.factories import pdf_bytes
from tools.processes import wait_for

pytestmark = pytest.mark.e2e

GUARD = 600  # seconds, against hangs only
BOOT_DELAY_S = 150.0
BOOTS = 8
SIM_GPU = "NVIDIA SIM BUSY"


@pytest.fixture
def busy_system(transactional_db, local_pool, deployment, tmp_path):
    """The simulator, and daphne and ``manage.py workers`` pointed at it, on the test database."""
    config = SimConfig(
        api_key="busy-key", boot_delay_s=BOOT_DELAY_S, model_load_s=0.5,
        gpu_types=[GpuTypeConfig(id=SIM_GPU, display_name="sim", secure_price=0.5,
                                 capacity={"SECURE": {"DC-1": BOOTS * 2}})],
    )  # fmt: skip
    # Q_WORKERS: the shipped default, as the issue measured it
    with system_on_simulator(config, tmp_path, Q_WORKERS="4") as (url, workers, _):
        yield url, workers


@pytest.mark.timeout(GUARD + 120)
def test_a_one_page_job_is_done_while_eight_runpod_boots_are_still_in_flight(busy_system, admin_user):
    url, workers = busy_system
    pool = Pool.objects.create(
        key=f"sim{uuid.uuid4().hex[:5]}", provider="runpod", max_pods=BOOTS, max_parallel_boots=BOOTS,
        lanes_per_pod=2, idle_seconds=3600,
        config={"image": "ghcr.io/example/fleetadmin-pod:1",
                "candidates": [{"gpu_types": [SIM_GPU], "cloud_type": "SECURE", "data_centers": ["DC-1"]}]},
    )  # fmt: skip
    admin = {"Authorization": f"Bearer {ApiToken.issue(user=admin_user, name='e2e', scopes=['admin'])[1]}"}
    submit = {"Authorization": f"Bearer {ApiToken.issue(user=admin_user, name='e2e', scopes=['submit'])[1]}"}
    booting = Pod.objects.filter(pool=pool, state=Pod.State.BOOTING)

    def logs() -> str:
        return workers.tail(120)

    response = httpx.post(f"{url}/v1/runpod/scale", headers=admin, json={"pool": pool.key, "pods": BOOTS, "wait_s": 0},
                          timeout=30)  # fmt: skip
    assert response.status_code == 202, response.text
    # The boots are in flight: eight pods booting, created at the provider.
    wait_for(lambda: booting.exclude(provider_id="").count() >= 1 and booting.count() == BOOTS, GUARD,
             lambda: f"the boots never started: {list(booting.values('name', 'provider_id'))}\n{logs()}")  # fmt: skip

    response = httpx.post(f"{url}/v1/jobs", headers=submit, data={"pool": "local"},
                          files={"files": ("one-page.pdf", pdf_bytes([["A single page"]]), "application/pdf")},
                          timeout=30)  # fmt: skip
    assert response.status_code == 201, response.text
    job = Job.objects.get(pk=response.json()["id"])

    def boots_in_flight() -> bool:
        return booting.count() == BOOTS and not Pod.objects.filter(pool=pool, state=Pod.State.READY).exists()

    def done_or_boots_over() -> bool:
        job.refresh_from_db()
        return job.is_finished or not boots_in_flight()

    wait_for(done_or_boots_over, GUARD, lambda: f"job {job.pk} neither finished nor did the boots end\n{logs()}")
    states = dict(Pod.objects.filter(pool=pool).values_list("name", "state"))
    assert job.is_finished and boots_in_flight(), (
        f"the one-page job ({job.status}) waited for the boots to end: {states}\n{logs()}"
    )
    assert job.status == Job.Status.DONE
