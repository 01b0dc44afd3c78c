"""A boot waits for a cheaper candidate that other boots are creating on, rather than take a
dearer one (pods/services/boot.py _waits_for_cheaper): a burst lands on the cheapest type with room."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.utils import timezone

from pods import capacity
from pods.models import Pod, Pool, pod_name
from pods.services import boot
from runpodsim import SimConfig, SimulatorThread
from runpodsim.config import GpuTypeConfig
from tests.pods.conftest import KEY
from tests.pods.helpers import passes_until_settled
from tests.runpod import use_simulator

CHEAP, DEAR = "GPU cheap", "GPU dear"
CHEAP_KEY = f"runpod|{CHEAP}|SECURE|DC-1"


@pytest.fixture
def two_types(monkeypatch, settings):
    config = SimConfig(api_key=KEY, boot_delay_s=0.2, model_load_s=0.2, page_latency_s=0.01, gpu_types=[
        GpuTypeConfig(id=CHEAP, display_name="cheap", secure_price=0.27, capacity={"SECURE": {"DC-1": 24}}),
        GpuTypeConfig(id=DEAR, display_name="dear", secure_price=0.40, capacity={"SECURE": {"DC-1": 24}}),
    ])  # fmt: skip
    with SimulatorThread(config) as simulator:
        use_simulator(simulator, monkeypatch, settings, api_key=KEY)
        settings.RUNPOD_RETRY_DELAYS = (0.01, 0.01)
        settings.DEPLOYMENT_PREFIX = f"t{uuid.uuid4().hex[:6]}"
        yield simulator


def _pool(size: int) -> Pool:
    return Pool.objects.create(key="two", provider="runpod", max_pods=size, max_parallel_boots=size, lanes_per_pod=2,
                               config={"image": "img:1", "candidates": [
                                   {"gpu_types": [DEAR, CHEAP], "data_centers": ["DC-1"]}]})  # fmt: skip


def _staged(pool: Pool, count: int):
    Pod.objects.bulk_create(
        Pod(pool=pool, name=pod_name(pool, f"{n:02d}"), lanes=2, **boot.staged(Pod.BootStage.CREATE))
        for n in range(count)
    )
    return Pod.objects.filter(pool=pool)


def test_a_burst_of_boots_lands_on_the_cheapest_type_with_room(two_types, transactional_db, settings):
    settings.PASS_CONCURRENCY = 8
    settings.BOOT_CHEAPER_WAIT_SECONDS = 600  # however slow this machine: the wait is not what is tested
    pods = _staged(_pool(12), 12)

    passes_until_settled(pods)

    assert set(pods.values_list("state", flat=True)) == {Pod.State.READY}
    assert set(pods.values_list("gpu_type", flat=True)) == {CHEAP}
    assert two_types.stats()["create_calls"] == 12  # no create refused, none on the dearer type


@pytest.mark.parametrize("walking_for", [0.0, 5.0])
def test_while_another_boot_creates_on_the_cheaper_type_a_boot_waits_for_it_then_takes_the_dearer(
    two_types, db, settings, walking_for
):
    settings.BOOT_CHEAPER_WAIT_SECONDS = 3.0
    pod = _staged(_pool(1), 1).get()
    Pod.objects.filter(pk=pod.pk).update(stage_started_at=timezone.now() - timedelta(seconds=walking_for))
    assert capacity.probe_acquire(CHEAP_KEY) == capacity.PROBE  # another boot's create is out on it

    boot.boot_step(pod.pk)

    pod.refresh_from_db()
    if walking_for < settings.BOOT_CHEAPER_WAIT_SECONDS:
        # Waits: no create call, its next step soon.
        assert (pod.boot_stage, pod.provider_id, two_types.stats()["create_calls"]) == (Pod.BootStage.CREATE, "", 0)
        assert pod.step_at > timezone.now() - timedelta(seconds=1)
    else:
        # Waited long enough: the dearer type, rather than no pod.
        assert (pod.gpu_type, two_types.stats()["create_calls"]) == (DEAR, 1)
