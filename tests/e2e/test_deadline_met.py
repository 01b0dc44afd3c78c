"""A deadline met on the RunPod simulator where the default sizing would miss it (issue 14): a
job through real daphne and ``manage.py workers`` on simulated pods of one lane at several
seconds a page. Without a deadline the pool is sized for cost (one pod: the forecast's balanced
figure, about four times the deadline); with it the scaler boots the pods the deadline needs.

Machine speed cannot decide it: the pages' time is the simulator's latency, the sizing assumes
pages twice as slow as they are (SCALE_SECONDS_PER_PAGE_GUESS), so the pods it boots finish in
about half the deadline, while one pod would need twice the deadline for the pages alone.
"""

from __future__ import annotations

import uuid
from datetime import timedelta

import httpx
import pytest
from django.utils import timezone

from accounts.models import ApiToken
from ocrjobs.models import Job
from pods import capacity
from pods.models import Pod, Pool
from runpodsim import SimConfig
from runpodsim.config import GpuTypeConfig
from tests.e2e.conftest import system_on_simulator
from tests.factories import pdf_bytes
from tools.processes import wait_for

# The scaler's sizing against the simulator's clock, not the database: once, on SQLite.
pytestmark = [pytest.mark.e2e, pytest.mark.once_sqlite]

GUARD = 180
BOOT_S = 3.0
PAGE_S = 5.0  # the simulator's latency per page: far above what a slow machine adds
PAGES = 18  # one one-lane pod: 90 s of pages
DEADLINE_S = 45.0  # half of that
MAX_PODS = 8
# The cost-aware sizing pays a boot and an idle tail per pod only for work 1/0.12 times as long:
# 0.12 x 180 lane-s / (3 s + 20 s) < 1 pod.
IDLE_S = 20
SIM_GPU = "NVIDIA SIM DEADLINE"


@pytest.fixture
def sim_system(transactional_db, deployment, tmp_path, monkeypatch, settings):
    config = SimConfig(
        api_key="dl-key", boot_delay_s=BOOT_S, model_load_s=0.0, page_latency_s=PAGE_S, default_lanes=1,
        gpu_types=[GpuTypeConfig(id=SIM_GPU, display_name="sim", secure_price=0.36,
                                 capacity={"SECURE": {"DC-1": MAX_PODS}})],
    )  # fmt: skip
    with system_on_simulator(
        config, tmp_path, SCALE_SECONDS_PER_PAGE_GUESS=str(2 * PAGE_S), SCALE_BOOT_SECONDS_GUESS=str(BOOT_S)
    ) as (url, workers, sim_url):
        monkeypatch.setenv("RUNPOD_API_BASE_URL", sim_url)
        monkeypatch.setenv("RUNPOD_API_KEY", "dl-key")
        settings.RUNPOD_API_KEY = "dl-key"
        # The front's forecast sizes with the same guesses as the workers' scaler.
        settings.SCALE_SECONDS_PER_PAGE_GUESS = 2 * PAGE_S
        settings.SCALE_BOOT_SECONDS_GUESS = BOOT_S
        assert capacity.catalogue_get("runpod", fresh=True) is not None
        yield url, workers


@pytest.mark.timeout(GUARD + 120)
def test_a_deadline_the_default_sizing_would_miss_is_met(sim_system, admin_user):
    url, workers = sim_system
    pool = Pool.objects.create(
        key=f"dl{uuid.uuid4().hex[:5]}", provider="runpod", max_pods=MAX_PODS, lanes_per_pod=1, idle_seconds=IDLE_S,
        config={"image": "ghcr.io/example/fleetadmin-pod:1",
                "candidates": [{"gpu_types": [SIM_GPU], "cloud_type": "SECURE", "data_centers": ["DC-1"]}]},
    )  # fmt: skip
    token = ApiToken.issue(user=admin_user, name="e2e", scopes=["submit"])[1]
    document = pdf_bytes([[f"page {n}"] for n in range(1, PAGES + 1)])
    deadline = timezone.now() + timedelta(seconds=DEADLINE_S)

    response = httpx.post(f"{url}/v1/jobs", headers={"Authorization": f"Bearer {token}"},
                          data={"pool": pool.key, "deadline": deadline.isoformat()},
                          files={"files": ("run.pdf", document, "application/pdf")}, timeout=60)  # fmt: skip

    assert response.status_code == 201, response.text
    default = response.json()["forecast"]["pools"][0]["sizings"]["balanced"]
    # The default (cost-aware) sizing: one pod, done well after the deadline.
    assert default["pods"] == 1 and default["minutes"] * 60 > 2 * DEADLINE_S, default
    job = Job.objects.get(pk=response.json()["id"])

    def finished() -> bool:
        job.refresh_from_db()
        return job.is_finished

    wait_for(finished, GUARD, lambda: f"job {job.pk} is {job.status}\n{workers.tail(120)}")
    pods = Pod.objects.filter(pool=pool).count()
    report = (f"done {(job.finished_at - job.created_at).total_seconds():.1f} s after submission on {pods} pods; "
              f"deadline {DEADLINE_S} s; default sizing {default}")  # fmt: skip
    print(report)
    assert job.status == Job.Status.DONE, report
    assert job.finished_at <= deadline, report
    assert pods > 1, report
