"""Boots of a RunPod pool, through the unmodified SDK, against the simulator."""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from datetime import timedelta

import pytest
from django.db.models import QuerySet
from django.utils import timezone

from pods import capacity, podclient
from pods.dashboard import pod_page
from pods.models import Alert, BootAttempt, CapacityVerdict, PassLease, Pod, Pool, pod_name
from pods.serializers import pod_dict, verdict_dict
from pods.services import boot, lifecycle, passes, reconcile, scaler
from runpodsim import SimConfig, SimulatorThread
from runpodsim import app as simulator_app
from runpodsim.config import GpuTypeConfig
from runpodsim.farm import Farm
from tests.pods.conftest import EMPTY, GOOD, KEY
from tests.pods.helpers import boot_until_settled, new_pod, passes_until_settled
from tests.runpod import pod_request, use_simulator
from tools.processes import REPO, child_env, wait_for


def test_a_boot_skips_candidates_without_capacity_and_joins_on_the_next(sim, pool):
    pod = boot_until_settled(new_pod(pool).pk)
    assert pod.state == Pod.State.READY, pod.error
    assert (pod.gpu_type, pod.data_center) == (GOOD, "EU-RO-1")
    assert podclient.pod_is_serving(pod.base_url, token=pod.token)
    outcomes = list(BootAttempt.objects.order_by("created_at").values_list("candidate", "outcome"))
    assert outcomes == [
        (f"runpod|{EMPTY}|SECURE|EU-RO-1", "no_capacity"),
        (f"runpod|{EMPTY}|SECURE|US-KS-2", "no_capacity"),
        (f"runpod|{GOOD}|SECURE|EU-RO-1", "created"),
    ]
    assert float(pod.cost_per_hr) == pytest.approx(0.30)


def test_a_pod_booted_on_a_candidate_naming_no_data_centre_records_where_runpod_placed_it(sim, pool):
    # The candidate lets RunPod choose; the create's answer says where (machine.dataCenterId), and
    # the dashboard shows it rather than "—" (issue 42, item 9). The candidate's own data centre
    # stays: it names the candidate a preemption blocks.
    Pool.objects.filter(pk=pool.pk).update(config={**pool.config, "candidates": [{"gpu_types": [GOOD]}]})

    pod = boot_until_settled(new_pod(pool).pk)

    assert pod.state == Pod.State.READY, pod.error
    assert (pod.gpu_type, pod.data_center, pod.placed_in, pod.location) == (GOOD, "", "EU-RO-1", "EU-RO-1")
    assert BootAttempt.objects.get().candidate == f"runpod|{GOOD}|SECURE|*"  # any data centre
    assert pod_dict(pod)["data_center"] == "EU-RO-1"
    assert [row["data_center"] for row in pod_page(page=1)["pods"]] == ["EU-RO-1"]


def test_every_later_boot_skips_a_candidate_that_said_no_capacity(sim, pool):
    boot_until_settled(new_pod(pool).pk)
    creates_before = sim.stats()["create_calls"]
    second = boot_until_settled(new_pod(pool).pk)
    assert second.state == Pod.State.READY
    assert sim.stats()["create_calls"] == creates_before + 1  # straight to the candidate with capacity
    blocked = capacity.blocked_keys([f"runpod|{EMPTY}|SECURE|EU-RO-1", f"runpod|{GOOD}|SECURE|EU-RO-1"])
    assert blocked == {f"runpod|{EMPTY}|SECURE|EU-RO-1"}


def test_a_verdict_ends_after_its_ttl_and_a_success_clears_it(sim, pool, settings):
    settings.CAPACITY_VERDICT_TTL_SECONDS = 0.001
    boot_until_settled(new_pod(pool).pk)
    assert capacity.blocked_keys([f"runpod|{EMPTY}|SECURE|EU-RO-1"]) == set()  # expired
    key = f"runpod|{GOOD}|SECURE|EU-RO-1"
    CapacityVerdict.objects.filter(key=key).update(reason="old", blocked_until=timezone.now() + timedelta(hours=1))
    capacity.probe_finish(key, how=capacity.OPEN, created=True)  # a create that was out meanwhile succeeded
    verdict = CapacityVerdict.objects.get(key=key)
    assert verdict.blocked_until is None and verdict.reason == ""


def test_only_one_probe_per_candidate_is_in_flight(sim, pool):
    key = f"runpod|{GOOD}|SECURE|EU-RO-1"
    assert capacity.probe_acquire(key) == capacity.PROBE
    assert capacity.probe_acquire(key) is None  # a second booter must wait or move on
    capacity.probe_finish(key, blocked_for=60, reason="no capacity")
    assert capacity.probe_acquire(key) is None  # blocked for everybody now


def test_a_probe_that_ends_in_an_error_leaves_the_candidate_to_the_next_probe(sim, pool):
    key = f"runpod|{GOOD}|SECURE|EU-RO-1"
    assert capacity.probe_acquire(key) == capacity.PROBE
    capacity.probe_finish(key)  # a transient error: says nothing of its capacity
    assert capacity.probe_acquire(key) == capacity.PROBE  # one probe again, not open


def test_a_candidate_that_just_gave_a_pod_lets_boots_create_on_it_side_by_side(sim, pool):
    key = f"runpod|{GOOD}|SECURE|EU-RO-1"
    assert capacity.probe_acquire(key) == capacity.PROBE
    capacity.probe_finish(key, created=True)
    assert capacity.probe_acquire(key) == capacity.OPEN
    assert CapacityVerdict.objects.get(key=key).probing_until is None  # no probe lock: a slot
    capacity.probe_finish(key, how=capacity.OPEN, created=True)
    assert [capacity.probe_acquire(key) for _ in range(2)] == [capacity.OPEN, capacity.OPEN]  # a second boot goes too
    # One of them is refused: the candidate is blocked for everybody, open no more.
    capacity.probe_finish(key, how=capacity.OPEN, blocked_for=60, reason="no capacity")
    assert capacity.probe_acquire(key) is None
    assert verdict_dict(CapacityVerdict.objects.get(key=key))["open"] is False


def test_a_boot_that_read_the_candidate_closed_does_not_probe_it_once_a_probe_opened_it(sim, pool, monkeypatch):
    """CI's boot storm: a candidate with room for one pod refused two boots. One boot read the
    candidate not open, the probe then ended with a pod (open, one slot, no probe lock), and the
    boot's probe write found no lock and probed it beside the boot that took the slot."""
    key = f"runpod|{GOOD}|SECURE|EU-RO-1"
    assert capacity.probe_acquire(key) == capacity.PROBE
    capacity.probe_finish(key, created=True)  # open, one slot
    assert capacity.probe_acquire(key) == capacity.OPEN  # the slot is out
    real_exists = QuerySet.exists
    # The read of "open" before the probe's success was written, the write after it.
    monkeypatch.setattr(QuerySet, "exists", lambda qs: False if qs.model is CapacityVerdict else real_exists(qs))
    assert capacity.probe_acquire(key) is None
    assert CapacityVerdict.objects.get(key=key).probing_until is None


def test_an_open_candidate_lets_out_only_the_creates_its_successes_earned(sim, pool):
    """bench/boot_storm.py made 177 create calls for 32 boots over 70 candidates (goal 102): every
    boot walking past a candidate that had just given a pod created on it at once, and where it
    had no more capacity each of them was refused. The creates out on an open candidate double
    with each round of successes; a refusal costs only those out."""
    key = f"runpod|{GOOD}|SECURE|EU-RO-1"
    assert capacity.probe_acquire(key) == capacity.PROBE
    capacity.probe_finish(key, created=True)
    out = []
    for round_size in (1, 2, 4, 8):
        took = [capacity.probe_acquire(key) for _ in range(10)]
        assert took == [capacity.OPEN] * round_size + [None] * (10 - round_size)
        for _ in range(round_size):
            capacity.probe_finish(key, how=capacity.OPEN, created=True)
        out.append(round_size)
    # A create whose error says nothing of capacity gives its slot back, and no more.
    assert capacity.probe_acquire(key) == capacity.OPEN
    capacity.probe_finish(key, how=capacity.OPEN)
    assert CapacityVerdict.objects.get(key=key).open_slots == 16
    # A verdict that lapsed opens afresh with one slot after the next probe's success.
    CapacityVerdict.objects.filter(key=key).update(open_until=timezone.now() - timedelta(seconds=1))
    assert capacity.probe_acquire(key) == capacity.PROBE
    capacity.probe_finish(key, created=True)
    assert [capacity.probe_acquire(key) for _ in range(2)] == [capacity.OPEN, None]


def test_boots_due_together_create_on_an_open_candidate_in_rounds_that_double(sim, pool, transactional_db, settings):
    """64 boots of one GPU type must not be created one a pass (issue 11's scale request took
    135 s for a 120 s boot): once a create succeeded, the rest create side by side, the creates
    out doubling each pass while the candidate keeps giving pods."""
    settings.PASS_CONCURRENCY = 8
    sim.set_capacity(GOOD, "SECURE", "EU-RO-1", 9)
    boot_until_settled(new_pod(pool).pk)  # opens the candidate with capacity (9 pods, 1 taken)
    pods = [
        Pod.objects.create(pool=pool, name=pod_name(pool, f"side{i}"), lanes=2, **boot.staged(Pod.BootStage.CREATE))
        for i in range(7)
    ]
    created = BootAttempt.objects.filter(pod__in=pods, outcome=BootAttempt.Outcome.CREATED)
    created_by_pass = []
    for _ in range(3):
        before = created.count()
        passes.pass_run()
        created_by_pass.append(created.count() - before)
        Pod.objects.filter(pk__in=[p.pk for p in pods], boot_stage=Pod.BootStage.CREATE).update(step_at=timezone.now())

    # Rounds of 1, 2 and 4 at the slowest (a create that returns while its pass still runs frees
    # its slots at once, for steps of the same pass); one a pass would be [1, 1, 1].
    assert sum(created_by_pass) == 7, created_by_pass
    creating = Pod.objects.filter(
        pk__in=[p.pk for p in pods], boot_stage__in=[Pod.BootStage.CREATE, Pod.BootStage.CREATING]
    )
    assert not creating.exists()
    refused = BootAttempt.objects.filter(pod__in=pods).exclude(outcome=BootAttempt.Outcome.CREATED)
    assert set(refused.values_list("candidate", flat=True)) <= {f"runpod|{GOOD}|SECURE|US-KS-2"}  # probed, once
    assert refused.count() <= 1


def test_a_bad_key_stops_boots_and_raises_an_alert(sim, pool, settings):
    settings.RUNPOD_API_KEY = "wrong-key"
    pod = boot_until_settled(new_pod(pool).pk)
    assert pod.state == Pod.State.FAILED
    alert = Alert.objects.get(kind=Alert.Kind.AUTH, resolved_at__isnull=True)
    assert "wrong-key" not in alert.message
    # Pages wait, yet the tick rents nothing while the key is refused.
    from tests.pods.test_pod_services import _pages

    _pages(pool, 4)
    assert scaler.pool_tick(pool=pool).booted == []


def test_a_pod_that_never_runs_is_terminated_and_its_spend_recorded(sim, pool, settings):
    settings.POD_RUNNING_TIMEOUT_SECONDS = 1.0
    sim.set_faults([{"kind": "boot_stuck", "count": 1}])
    pod = boot_until_settled(new_pod(pool).pk)
    assert pod.state == Pod.State.FAILED and "not running" in pod.error
    assert pod.billed_from is not None and pod.ended_at >= pod.billed_from
    assert pod.spend() > 0
    assert pod.terminate_pending  # the next pass terminates it at the provider
    lifecycle.terminate_step(pod.pk)  # what that pass does
    assert sim.stats()["pods_running"] == 0
    assert sim.stats()["terminate_calls"] == 1


def test_a_pod_config_with_a_quote_is_refused_before_any_call(sim, db):
    from django.core.exceptions import ValidationError

    pool = Pool(key="bad", provider="runpod", config={"image": "img:1", "env": {"X": 'a"b'},
                                                       "candidates": [{"gpu_types": [GOOD]}]})  # fmt: skip
    with pytest.raises(ValidationError) as refused:
        pool.full_clean()
    assert "config" in refused.value.message_dict
    assert sim.stats()["graphql_calls"] == 0


def test_the_catalogue_is_fetched_once_per_ttl_and_kept_when_a_fetch_fails(sim, db, settings):
    first = capacity.catalogue_get("runpod")
    second = capacity.catalogue_get("runpod")
    assert sim.stats()["catalogue_calls"] == 1
    assert first.offers == second.offers and first.offers is not second.offers
    assert {o.gpu_type for o in first.offers} == {EMPTY, GOOD}

    settings.CATALOGUE_TTL_SECONDS = 0
    sim.set_faults([{"kind": "http_error", "status": 503, "count": 10}])
    kept = capacity.catalogue_get("runpod")
    assert kept.stale and kept.offers == first.offers
    sim.set_faults([])
    fresh = capacity.catalogue_get("runpod", fresh=True)
    assert not fresh.stale and fresh.offers == first.offers


PASSES = """
import django, os, time
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "fleetadmin.settings")
django.setup()
from pods.services.passes import pass_run
while True:  # passes, as the workers run them when the clock asks
    pass_run()
    time.sleep(0.05)
"""


def _a_pass_killed_mid_create(sim, pool: Pool, tmp_path) -> Pod:
    """Passes run in a process of their own; it is killed with -9 while a boot step is inside its
    create call, which RunPod has carried out but not answered yet. The boot is left as that crash
    leaves it: "creating", no provider id, held by the dead step's lease."""
    pod = Pod.objects.create(pool=pool, name=pod_name(pool, uuid.uuid4().hex[:8]), lanes=pool.lanes_per_pod,
                             **boot.staged(Pod.BootStage.CREATE))  # fmt: skip
    # Creates go through at once, but their answers are held back: time to kill the process.
    sim.set_faults([{"kind": "slow", "delay_s": 60, "after_execute": True, "operation": "podFindAndDeployOnDemand"}])
    env = child_env(tmp_path, RUNPOD_API_BASE_URL=os.environ["RUNPOD_API_BASE_URL"], RUNPOD_API_KEY=KEY,
                    RUNPOD_POD_URL_TEMPLATE=sim.pod_url_template)  # fmt: skip
    worker = subprocess.Popen([sys.executable, "-c", PASSES], cwd=REPO, env=env)
    try:
        wait_for(lambda: sim.stats()["pods_total"] >= 1, 30, "the create never reached the simulator")
    finally:
        worker.send_signal(signal.SIGKILL)
        worker.wait()
    pod.refresh_from_db()
    assert (pod.state, pod.boot_stage, pod.provider_id) == (Pod.State.BOOTING, Pod.BootStage.CREATING, "")
    assert boot.boots_due(now=timezone.now(), limit=10) == []  # the dead step's lease still holds it
    sim.set_faults([])
    return pod


def _the_dead_leases_lapse(pod: Pod) -> None:
    """The dead step's lease lapses after BOOT_STEP_LEASE_SECONDS and the dead pass's after
    PASS_LEASE_SECONDS: aged here rather than waited for."""
    lapsed = {"task_lease_until": timezone.now() - timedelta(seconds=1)}
    Pod.objects.filter(pk=pod.pk).update(**lapsed)
    PassLease.objects.update(**lapsed)


def test_a_boot_step_killed_in_its_create_is_resumed_by_the_next_pass_with_one_pod(
    sim, pool, transactional_db, tmp_path
):
    pod = _a_pass_killed_mid_create(sim, pool, tmp_path)
    assert passes.pass_run() is None  # nor does a pass run while the dead one's lease holds

    _the_dead_leases_lapse(pod)
    assert passes.pass_run().steps["boot"] == 1  # the next pass: it lists the pods by the boot's name

    pod.refresh_from_db()
    assert pod.boot_stage == Pod.BootStage.RUNNING and pod.provider_id  # adopted, not created again
    passes_until_settled(Pod.objects.filter(pk=pod.pk))
    pod.refresh_from_db()
    assert pod.state == Pod.State.READY, pod.error
    assert [p["id"] for p in sim.pods() if p["name"] == pod.name] == [pod.provider_id]
    assert sim.stats()["pods_total"] == 1  # one pod was ever created, and it serves


def test_a_worker_killed_between_create_and_save_leaves_no_pod_billing(sim, pool, transactional_db, settings, tmp_path):
    """The create reaches RunPod, the step dies before saving, and reconcile comes first: it adopts the pod."""
    settings.RECONCILE_GRACE_SECONDS = 0.5
    pod = _a_pass_killed_mid_create(sim, pool, tmp_path)

    result = wait_for(lambda: reconcile.reconcile(provider_name="runpod").adopted, 10, "reconcile adopted nothing")
    pod.refresh_from_db()
    assert result == [pod.name] and pod.provider_id and pod.boot_stage == Pod.BootStage.RUNNING
    _the_dead_leases_lapse(pod)
    assert boot_until_settled(pod.pk).state == Pod.State.READY  # the boot goes on, nothing created twice
    assert sim.stats()["pods_total"] == 1  # one pod was ever created, and it serves


def test_reconcile_terminates_a_stranger_pod_no_pool_wants_and_marks_lost_ones(sim, pool, settings):
    settings.RECONCILE_GRACE_SECONDS = 0
    from pods.providers.base import Offer, PodSpec
    from pods.providers.runpod import RunPodProvider

    stranger = RunPodProvider().create(PodSpec(name=f"{settings.DEPLOYMENT_PREFIX}-nopool-abc", lanes=1,
                                               offer=Offer(GOOD, "SECURE", "EU-RO-1"), image="img:1"))  # fmt: skip
    ready = boot_until_settled(new_pod(pool).pk)
    RunPodProvider().terminate(ready.provider_id)  # gone behind our back

    result = reconcile.reconcile(provider_name="runpod")
    assert result.terminated == [stranger.name]
    assert result.lost == [ready.name]
    assert Pod.objects.get(pk=ready.pk).state == Pod.State.LOST
    assert sim.stats()["pods_running"] == 0


def test_reconcile_terminates_a_stranger_pod_even_when_its_pool_wants_one(sim, pool, settings):
    # Named like one of the pool's pods, but without a row: its token is unknown, so it could never
    # take a page (adopted with a new token, every request to it was refused until it timed out).
    settings.RECONCILE_GRACE_SECONDS = 0
    from ocrjobs.models import Page
    from pods.providers.base import Offer, PodSpec
    from pods.providers.runpod import RunPodProvider
    from tests.pods.test_pod_services import _pages

    _pages(pool, 5)
    assert Page.objects.filter(status=Page.Status.PENDING).count() == 5  # the pool wants pods
    stranger = RunPodProvider().create(PodSpec(name=f"{settings.DEPLOYMENT_PREFIX}-{pool.key}-abc", lanes=1,
                                               offer=Offer(GOOD, "SECURE", "EU-RO-1"), image="img:1"))  # fmt: skip

    result = reconcile.reconcile(provider_name="runpod")

    assert (result.adopted, result.terminated) == ([], [stranger.name])
    assert not Pod.objects.filter(name=stranger.name).exists()
    assert sim.stats()["pods_running"] == 0


@pytest.fixture
def boot_clock(monkeypatch, request):
    """The ``sim`` simulator on a clock that moves only while the boot waits for its next step: its
    pods run, then load their model, after the same polls on any machine (a busy one would find them
    ready at once)."""
    now = [0.0]
    monkeypatch.setattr(simulator_app, "Farm", functools.partial(Farm, clock=lambda: now[0]))
    return request.getfixturevalue("sim"), now


def test_a_boot_asks_how_its_pod_is_doing_every_pod_poll_seconds(boot_clock, pool, settings, monkeypatch):
    sim, now = boot_clock
    settings.POD_POLL_SECONDS = 0.07
    polls = []  # (stage, when the step began, the next step it set, when it ended) of the waits
    step = boot.boot_step

    def timed_step(pod_id):
        stage, began = Pod.objects.get(pk=pod_id).boot_stage, timezone.now()
        step(pod_id)
        after = Pod.objects.get(pk=pod_id)
        if after.boot_stage == stage and stage in (Pod.BootStage.RUNNING, Pod.BootStage.MODEL):
            polls.append((stage, began, after.step_at, timezone.now()))

    def sleep(seconds):
        now[0] += seconds  # the only way the simulator's time passes
        time.sleep(seconds)

    monkeypatch.setattr(boot, "boot_step", timed_step)

    pod = boot_until_settled(new_pod(pool).pk, sleep=sleep)

    assert pod.state == Pod.State.READY, pod.error
    assert {stage for stage, *_ in polls} == {Pod.BootStage.RUNNING, Pod.BootStage.MODEL}, polls  # it waited for both
    poll = timedelta(seconds=settings.POD_POLL_SECONDS)
    assert all(began + poll <= next_step <= ended + poll for _, began, next_step, ended in polls), polls


@pytest.fixture
def wide_sim(monkeypatch, settings):
    """Eight GPU types with room for 64 pods each: every boot of a storm finds a candidate at once."""
    config = SimConfig(api_key=KEY, boot_delay_s=0.3, model_load_s=0.3, page_latency_s=0.01, gpu_types=[
        GpuTypeConfig(id=f"GPU {n}", display_name=f"gpu{n}", secure_price=0.20 + n / 100,
                      capacity={"SECURE": {"DC-1": 64}}) for n in range(8)])  # fmt: skip
    with SimulatorThread(config) as simulator:
        use_simulator(simulator, monkeypatch, settings, api_key=KEY)
        settings.RUNPOD_RETRY_DELAYS = (0.01, 0.01)
        settings.DEPLOYMENT_PREFIX = f"t{uuid.uuid4().hex[:6]}"
        yield simulator


def test_one_pass_at_a_time_advances_64_boots_on_a_bounded_pool_of_threads(
    wide_sim, transactional_db, settings, monkeypatch
):
    settings.PASS_CONCURRENCY = 8
    # Every boot may take the first type with a free slot, dearer or not: the pass's threads are
    # what is tested here (a boot's wait for a cheaper type: tests/pods/test_boot_cheapest.py).
    settings.BOOT_CHEAPER_WAIT_SECONDS = 0
    pool = Pool.objects.create(key="wide", provider="runpod", max_pods=64, max_parallel_boots=64, lanes_per_pod=2,
                               config={"image": "img:1", "candidates": [
                                   {"gpu_types": [f"GPU {n}" for n in range(8)], "data_centers": ["DC-1"]}]})  # fmt: skip
    pods = Pod.objects.filter(pool=pool)
    Pod.objects.bulk_create(
        Pod(pool=pool, name=pod_name(pool, f"{n:02d}"), lanes=2, **boot.staged(Pod.BootStage.CREATE)) for n in range(64)
    )
    lock, running, most, threads = threading.Lock(), [0], [0], set()
    step = boot.boot_step

    def counted_step(pod_id: int) -> None:
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
            threads.add(threading.get_ident())
        try:
            step(pod_id)
        finally:
            with lock:
                running[0] -= 1

    monkeypatch.setattr(boot, "boot_step", counted_step)
    capacity.catalogue_get("runpod")  # cached, as after the first boot (a step never waits for it)

    first = passes.pass_run()

    assert (first.steps["boot"], first.errors) == (64, 0)  # every boot moved, in one pass
    assert set(pods.values_list("boot_stage", flat=True)) == {Pod.BootStage.RUNNING}  # each created, one step
    assert pods.exclude(provider_id="").count() == 64
    assert wide_sim.stats()["create_calls"] == 64
    assert len(threads) <= settings.PASS_CONCURRENCY  # not a thread (nor a worker) per boot

    later = passes_until_settled(pods)

    assert set(pods.values_list("state", flat=True)) == {Pod.State.READY}
    assert all(result.steps["boot"] <= 64 and not result.errors for result in later)
    assert most[0] <= settings.PASS_CONCURRENCY  # steps at once, in every pass
    assert wide_sim.stats()["pods_total"] == 64 and wide_sim.stats()["catalogue_calls"] == 1


def test_a_pod_released_while_its_create_call_is_out_is_terminated_not_joined(sim, pool, monkeypatch):
    from pods.providers.runpod import RunPodProvider
    from pods.services import lifecycle

    create = RunPodProvider.create

    def create_while_released(self, spec):
        created = create(self, spec)  # RunPod makes the pod; meanwhile a person releases the boot
        lifecycle.pod_release(pod=Pod.objects.get(name=spec.name), reason="asked meanwhile")
        return created

    monkeypatch.setattr(RunPodProvider, "create", create_while_released)

    pod = boot_until_settled(new_pod(pool).pk)

    assert (pod.state, pod.error, pod.ready_at) == (Pod.State.TERMINATED, "released: asked meanwhile", None)
    assert pod.provider_id and pod.terminate_pending  # what the create made is known, and the next pass stops it
    lifecycle.terminate_step(pod.pk)  # what that pass does
    assert [p["id"] for p in sim.pods() if p["desired_status"] != "TERMINATED"] == []


# --- the stage limits, counted across steps (aged here rather than waited for) ---------------------


def _step_until_stage(pod: Pod, stage: str) -> Pod:
    for _ in range(50):
        pod.refresh_from_db()
        if pod.boot_stage == stage or pod.state != Pod.State.BOOTING:
            return pod
        if pod.step_at and (wait := (pod.step_at - timezone.now()).total_seconds()) > 0:
            time.sleep(wait)
        boot.boot_step(pod.pk)
    raise AssertionError(f"{pod.name} never reached {stage}: {pod.boot_stage}")


def _age(pod: Pod, seconds: float) -> None:
    """The stage began ``seconds`` earlier and the next step is due now."""
    Pod.objects.filter(pk=pod.pk).update(
        stage_started_at=pod.stage_started_at - timedelta(seconds=seconds), step_at=timezone.now()
    )


def test_a_boot_whose_candidates_other_boots_keep_probing_waits_without_a_call_then_fails_at_its_limit(
    sim, pool, settings
):
    keys = [f"runpod|{gpu}|SECURE|{dc}" for gpu in (EMPTY, GOOD) for dc in ("EU-RO-1", "US-KS-2")]
    capacity.catalogue_get("runpod")
    assert all(capacity.probe_acquire(key) for key in keys)  # other boots are trying every candidate
    pod = Pod.objects.create(pool=pool, name=pod_name(pool, "probed"), lanes=2, **boot.staged(Pod.BootStage.CREATE))
    creates = sim.stats()["create_calls"]

    boot.boot_step(pod.pk)

    pod.refresh_from_db()
    assert (pod.state, pod.boot_stage) == (Pod.State.BOOTING, Pod.BootStage.CREATE)
    assert pod.step_at > timezone.now() - timedelta(seconds=1)  # looked at again soon, not in a hot loop
    _age(pod, settings.POD_CREATE_TIMEOUT_SECONDS + 1)
    boot.boot_step(pod.pk)

    pod.refresh_from_db()
    assert pod.state == Pod.State.FAILED and "no candidate free after" in pod.error
    assert sim.stats()["create_calls"] == creates  # none was ever free: nothing was created


def test_a_pod_whose_model_never_answers_fails_at_the_ready_limit_and_is_terminated(sim, pool, settings):
    sim.set_faults([{"kind": "model_fail", "count": 1}])
    pod = _step_until_stage(new_pod(pool), Pod.BootStage.MODEL)
    boot.boot_step(pod.pk)  # the model does not answer: still loading
    assert Pod.objects.get(pk=pod.pk).state == Pod.State.BOOTING

    _age(pod, settings.POD_READY_TIMEOUT_SECONDS + 1)
    boot.boot_step(pod.pk)

    pod.refresh_from_db()
    assert pod.state == Pod.State.FAILED and "its model was not ready" in pod.error
    assert pod.billed_from <= pod.ended_at  # billed until it ended
    assert pod.terminate_pending  # the next pass terminates it at the provider
    lifecycle.terminate_step(pod.pk)  # what that pass does
    assert sim.stats()["pods_running"] == 0 and sim.stats()["terminate_calls"] == 1


def test_while_its_model_loads_a_boot_asks_the_provider_one_step_in_a_few_and_fails_if_the_pod_went_away(
    sim, pool, settings
):
    from pods.providers.runpod import RunPodProvider

    sim.set_faults([{"kind": "model_fail", "count": 1}])
    pod = _step_until_stage(new_pod(pool), Pod.BootStage.MODEL)

    def step() -> int:
        """The next step (due now: the clock is not what decides); the provider calls it made."""
        calls = sim.stats()["graphql_calls"]
        Pod.objects.filter(pk=pod.pk).update(step_at=timezone.now())
        boot.boot_step(pod.pk)
        return sim.stats()["graphql_calls"] - calls

    few = boot.PROVIDER_CHECK_POLLS
    assert [step() for _ in range(few)] == [0] * few  # each asks the pod
    assert step() == 1  # this one asks the provider instead
    assert [step() for _ in range(few - 1)] == [0] * (few - 1)
    assert Pod.objects.get(pk=pod.pk).state == Pod.State.BOOTING
    RunPodProvider().terminate(pod.provider_id)  # gone behind our back

    step()  # the provider's turn again

    pod.refresh_from_db()
    assert pod.state == Pod.State.FAILED and pod.error == "the pod went away while loading its model"


def _pod_env(sim, provider_id: str) -> dict[str, str]:
    """The pod's environment as RunPod holds it (what create_pod was given)."""
    import httpx

    query = f'query {{ pod(input: {{podId: "{provider_id}"}}) {{ env }} }}'
    answer = httpx.post(f"{sim.url}/graphql", json={"query": query}, headers={"Authorization": f"Bearer {KEY}"})
    return dict(item.split("=", 1) for item in answer.raise_for_status().json()["data"]["pod"]["env"])


def test_a_boot_passes_the_pods_own_token_in_its_environment_and_asks_with_it(sim, pool):
    first = boot_until_settled(new_pod(pool).pk)
    second = boot_until_settled(new_pod(pool).pk)

    assert first.state == second.state == Pod.State.READY, (first.error, second.error)
    assert len(first.token) >= 40 and first.token != second.token
    env = _pod_env(sim, first.provider_id)
    assert env["POD_TOKEN"] == first.token
    assert env["MODEL"] == "olmocr"  # the pool's own env goes along
    # The virtual pod checks it as the pod server does: the boot's health checks sent it.
    assert pod_request("GET", f"{first.base_url}/v1/models").status_code == 401
    wrong = {"Authorization": f"Bearer {second.token}"}
    assert pod_request("GET", f"{first.base_url}/v1/models", headers=wrong).status_code == 401
    models = pod_request("GET", f"{first.base_url}/v1/models", headers={"Authorization": f"Bearer {first.token}"})
    assert models.status_code == 200 and models.json()["ready"]
    assert first.engine["ready"]


def test_a_pods_token_is_never_shown(sim, pool, admin_client, caplog):
    import json as json_module

    caplog.set_level("DEBUG")
    pod = boot_until_settled(new_pod(pool).pk)
    assert pod.state == Pod.State.READY, pod.error

    shown = [json_module.dumps(pod_dict(pod))]
    for path in ("/v1/runpod/status", "/metrics", f"/admin/pods/pod/{pod.pk}/change/", "/admin/pods/pod/"):
        response = admin_client.get(path)
        assert response.status_code == 200, path
        shown.append(response.content.decode())
    shown.append(caplog.text)
    assert not [text for text in shown if pod.token in text]
