"""The forecast against a real run (issue 14): a job on the RunPod simulator, whose price, boot
time and page latency are known, through real daphne and ``manage.py workers``. What the pool
was billed (its pod, create to release) and how long the job took once its pod was asked for are
each within 25% of the forecast the submission answered (the run cannot be quicker than the
forecast's boot and pages). The wait before the pod was asked for (the split, the scaler's turn) is
this machine's own work, which the forecast does not model and a loaded host stretches: 6.7 s of a
46 s run on a 2-core machine running both CI suites at once. It is printed, not held to the 25%.
"""

from __future__ import annotations

import uuid
from decimal import Decimal

import httpx
import pytest

from accounts.models import ApiToken
from ocrjobs.models import Job
from pods import capacity
from pods.models import Pod, Pool, SpendEntry
from runpodsim import SimConfig
from runpodsim.config import GpuTypeConfig
from tests.e2e.conftest import system_on_simulator
from tests.factories import pdf_bytes
from tools.processes import wait_for

# The forecast against the simulator's clock and prices, not the database: once, on SQLite.
pytestmark = [pytest.mark.e2e, pytest.mark.once_sqlite]

GUARD = 300
PRICE = 3.60  # $/h: a cent a second
# The forecast models the pod's time (its boot, its pages), not this machine's own work around
# them (the split, the scaler, the passes' polls, the dispatch), which a loaded host slows: 1.2 s
# of a 24 s run at load 7, 2.8 s at load 26, against 6 s of tolerance. Pages of 2 s make the
# modelled time 36 s and the tolerance 9 s; the 25 % is unchanged.
BOOT_S = 12.0
PAGE_S = 2.0
PAGES = 24
LANES = 2
IDLE_S = 5
DURATION_TOLERANCE = 0.25
SIM_GPU = "NVIDIA SIM FORECAST"


@pytest.fixture
def sim_system(transactional_db, deployment, tmp_path, monkeypatch, settings):
    config = SimConfig(
        api_key="fc-key", boot_delay_s=BOOT_S, model_load_s=0.0, page_latency_s=PAGE_S, default_lanes=LANES,
        gpu_types=[GpuTypeConfig(id=SIM_GPU, display_name="sim", secure_price=PRICE,
                                 capacity={"SECURE": {"DC-1": 4}})],
    )  # fmt: skip
    with system_on_simulator(
        config, tmp_path, SCALE_SECONDS_PER_PAGE_GUESS=str(PAGE_S), SCALE_BOOT_SECONDS_GUESS=str(BOOT_S)
    ) as (url, workers, sim_url):
        # The forecast reads the stored catalogue; a worker would fetch it on the first boot.
        monkeypatch.setenv("RUNPOD_API_BASE_URL", sim_url)
        monkeypatch.setenv("RUNPOD_API_KEY", "fc-key")
        settings.RUNPOD_API_KEY = "fc-key"
        assert capacity.catalogue_get("runpod", fresh=True) is not None
        yield url, workers


@pytest.mark.timeout(GUARD + 120)
def test_the_forecast_is_within_25_percent_of_the_runs_duration_and_cost(sim_system, admin_user):
    url, workers = sim_system
    pool = Pool.objects.create(
        key=f"fc{uuid.uuid4().hex[:5]}", provider="runpod", max_pods=1, lanes_per_pod=LANES, idle_seconds=IDLE_S,
        config={"image": "ghcr.io/example/fleetadmin-pod:1",
                "candidates": [{"gpu_types": [SIM_GPU], "cloud_type": "SECURE", "data_centers": ["DC-1"]}]},
    )  # fmt: skip
    token = ApiToken.issue(user=admin_user, name="e2e", scopes=["submit"])[1]
    document = pdf_bytes([[f"page {n}"] for n in range(1, PAGES + 1)])

    response = httpx.post(f"{url}/v1/jobs", headers={"Authorization": f"Bearer {token}"},
                          data={"pool": pool.key}, files={"files": ("run.pdf", document, "application/pdf")},
                          timeout=60)  # fmt: skip

    assert response.status_code == 201, response.text
    forecast = response.json()["forecast"]
    assert forecast["pages"] == PAGES
    mine = forecast["pools"][0]
    assert mine["pool"] == pool.key and mine["based_on"]["price_per_pod_hour"] == PRICE
    expected = mine["sizings"]["balanced"]
    assert expected["pods"] == 1
    job = Job.objects.get(pk=response.json()["id"])

    def finished_and_released() -> bool:
        job.refresh_from_db()
        return job.is_finished and not Pod.objects.filter(pool=pool, state__in=Pod.ALIVE_STATES).exists()

    wait_for(finished_and_released, GUARD, lambda: f"job {job.pk} is {job.status}\n{workers.tail(120)}")
    assert job.status == Job.Status.DONE
    dollars = float(sum(SpendEntry.objects.filter(pool=pool).values_list("dollars", flat=True), Decimal(0)))
    pod = Pod.objects.get(pool=pool)
    minutes = (job.finished_at - pod.created_at).total_seconds() / 60  # from the pod asked for to the job done
    first_page = job.pages.order_by("started_at").values_list("started_at", flat=True).first()

    def after(at) -> str:
        return f"{(at - job.created_at).total_seconds():.1f} s" if at else "-"

    report = (f"forecast {expected}, actual {minutes:.2f} min from the pod row to done, ${dollars:.4f}; "
              f"after submission: pod row "
              f"{after(pod.created_at)}, created at the provider {after(pod.billed_from)}, ready "
              f"{after(pod.ready_at)}, first page {after(first_page)}, done {after(job.finished_at)}")  # fmt: skip
    print(report)
    assert abs(dollars - expected["dollars"]) <= 0.25 * expected["dollars"], report
    assert 0.9 * expected["minutes"] <= minutes <= (1 + DURATION_TOLERANCE) * expected["minutes"], report
