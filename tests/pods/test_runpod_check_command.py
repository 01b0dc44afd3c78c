"""``manage.py runpod_check`` against the simulator in realistic mode (429s, gateway pages, listing
lag, runtime reading null, a terminate that writes EXITED, ...): it rents a pod, reaches its pod
server, terminates it whatever happened, prints RunPod's words and codes and the spend, and exits
non-zero when a step failed. Nothing is left billing in any of them."""

from __future__ import annotations

import io
import os
import re
import signal
import threading
import time

import pytest
from django.core.management import CommandError, call_command

from pods.models import Pool
from runpodsim import SimConfig
from runpodsim.config import CAPACITY_WORDINGS, GpuTypeConfig
from tests.pods.conftest import KEY, simulated

GPU, DEARER = "NVIDIA CHECK 1", "NVIDIA CHECK 2"
# The realistic faults' draws repeat with a seed; with this one the first create is answered with
# a pod whose image pulls for "3 minutes" (3 s at this time scale) and then runs.
SEED = 19


def _realistic() -> SimConfig:
    return SimConfig(
        api_key=KEY,
        boot_delay_s=0.1,
        model_load_s=0.3,
        page_latency_s=0.01,
        gpu_types=[
            GpuTypeConfig(id=GPU, secure_price=0.30, community_price=0.20, capacity={"SECURE": {"EU-RO-1": 2}}),
            GpuTypeConfig(id=DEARER, secure_price=0.50, capacity={"SECURE": {"EU-RO-1": 2}}),
        ],
    ).realistic(seed=SEED, time_scale=60)


@pytest.fixture
def sim(monkeypatch, settings):
    settings.POD_POLL_SECONDS, settings.POD_POLL_MAX_SECONDS = 0.05, 0.2
    with simulated(_realistic(), monkeypatch, settings) as simulator:
        yield simulator


@pytest.fixture
def pool(db):
    return Pool.objects.create(
        key="check",
        provider="runpod",
        max_pods=1,
        lanes_per_pod=2,
        config={"image": "ghcr.io/example/fleetadmin-pod:1", "candidates": [{"gpu_types": [DEARER, GPU]}]},
    )


def faults_first(sim, *faults: dict) -> None:
    """``faults`` before the realistic ones (a pod's fault is the first that fires)."""
    sim.set_faults([*faults, *(fault.model_dump() for fault in sim.config.faults)])


def check(*args: str) -> tuple[str, CommandError | None]:
    out = io.StringIO()
    try:
        call_command("runpod_check", *args, stdout=out)
    except CommandError as exc:
        return out.getvalue(), exc
    return out.getvalue(), None


def nothing_billing(sim) -> bool:
    stats = sim.stats()
    return stats["pods_billing"] == 0 and stats["pods_created"] == stats["pods_terminated"]


def test_it_rents_the_cheapest_pod_reaches_its_server_and_terminates_it(sim, pool):
    out, failed = check("check")
    assert failed is None, out
    created = re.search(r"^created  (\w+) \(fleetadmin-check-check-\w+\) on (.+?) \(", out, re.M)
    assert created and created.group(2) == f"{GPU} SECURE", out  # the cheapest of the pool's candidates
    # It waited out the image pull (RUNNING, runtime null) without counting it a failure.
    assert "pod    created, not running yet" in out and sim.stats()["image_pulls_slow"] == 1
    assert re.search(r"^running  after .* at http://", out, re.M), out
    assert re.search(r'^healthz  200 \{"status": ?"ok"', out, re.M), out
    assert re.search(r"^models   200 .*\"ready\": ?true", out, re.M), out
    assert f"terminated {created.group(1)}" in out
    spend = re.search(r"^spend    \$(\S+) \(\$0\.3/h × (\S+) s", out, re.M)
    assert spend and float(spend.group(1)) > 0, out
    assert nothing_billing(sim) and sim.stats()["pods_created"] == 1


def test_with_spot_it_rents_an_interruptible_pod_at_the_minimum_bid(sim, pool):
    out, failed = check("check", "--spot")
    assert failed is None, out
    assert f"create   {GPU} SECURE (interruptible, bid $0.18/h)" in out  # secure's own lowest bid
    assert sim.stats()["interruptible_create_calls"] == 1 and nothing_billing(sim)


def test_a_capacity_refusal_prints_runpods_wording_and_code_and_fails(sim, pool):
    faults_first(sim, {"kind": "no_capacity"}, {"kind": "capacity_wording", "wording": "coded"})
    out, failed = check("check")
    message, code = CAPACITY_WORDINGS["coded"]
    assert failed is not None and "no candidate of the 2 gave a pod" in str(failed)
    assert out.count(f"answer NoCapacity: {message} ({code})") == 2, out
    assert "spend    $0 (no pod was rented)" in out
    assert sim.stats()["pods_created"] == 0 and nothing_billing(sim)


def test_a_refusal_in_words_the_provider_does_not_know_is_shown_and_fails_the_check(sim, pool):
    refusal = {"kind": "graphql_error", "message": "A refusal nobody has seen", "code": "ODD", "count": 1}
    faults_first(sim, {**refusal, "operation": "podFindAndDeployOnDemand"})
    out, failed = check("check")
    assert "answer BadRequest: RunPod refused the request: A refusal nobody has seen (ODD)" in out
    assert failed is not None and "A refusal nobody has seen" in str(failed)
    assert "healthz  200" in out  # the walk went on to the next candidate, which gave a pod
    assert nothing_billing(sim)


@pytest.mark.parametrize(
    ("fault", "said"),
    [
        ({"kind": "model_fail", "count": 1}, "the pod server's engine failed"),
        ({"kind": "image_pull", "pull_s": 0.5, "fails": True, "count": 1}, "RunPod stopped pod"),
    ],
)
def test_a_failure_after_the_create_still_terminates_the_pod(sim, pool, fault, said):
    faults_first(sim, fault)
    out, failed = check("check")
    assert failed is not None and said in str(failed), out
    created = re.search(r"^created  (\w+)", out, re.M)
    assert created and f"terminated {created.group(1)}" in out
    assert re.search(r"^spend    \$\S+ \(\$0\.3/h", out, re.M), out
    assert nothing_billing(sim)


def test_a_pod_that_never_runs_is_terminated_when_the_deadline_passes(sim, pool):
    faults_first(sim, {"kind": "boot_stuck", "count": 1})
    out, failed = check("check", "--deadline", "2")
    assert failed is not None and "deadline passed" in str(failed)
    assert re.search(r"^terminated \w+", out, re.M) and nothing_billing(sim)


def test_ctrl_c_while_it_waits_terminates_the_pod_and_fails(sim, pool):
    faults_first(sim, {"kind": "boot_stuck", "count": 1})

    # A Ctrl-C that came after the command ended (it failed early) must not stop the test run:
    # while this test runs, SIGINT interrupts only the command.
    running = threading.Event()
    running.set()

    def interrupt_once_created() -> None:
        guard = time.monotonic() + 60
        while running.is_set() and sim.stats()["pods_created"] == 0 and time.monotonic() < guard:
            time.sleep(0.05)
        if running.is_set() and sim.stats()["pods_created"]:
            os.kill(os.getpid(), signal.SIGINT)  # as a terminal's Ctrl-C: KeyboardInterrupt in the main thread

    def only_while_running(signum, frame) -> None:
        if running.is_set():
            raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, only_while_running)
    interrupter = threading.Thread(target=interrupt_once_created)
    interrupter.start()
    try:
        out, failed = check("check", "--deadline", "120")
    finally:
        running.clear()
        interrupter.join()
        signal.signal(signal.SIGINT, previous)
    assert failed is not None and "interrupted" in str(failed)
    assert "interrupted: terminating what was rented" in out
    assert re.search(r"^terminated \w+", out, re.M) and nothing_billing(sim)


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["nope"], "no pool 'nope'"),
        (["check", "--bid", "0.2"], "--bid goes with --spot"),
        (["check", "--deadline", "0"], "--deadline must be a positive"),
    ],
)
def test_it_refuses_bad_arguments_before_renting_anything(sim, pool, args, error):
    out, failed = check(*args)
    assert failed is not None and error in str(failed)
    assert sim.stats()["create_calls"] == 0


def test_it_refuses_a_pool_that_is_not_a_runpod_pool(sim, db):
    Pool.objects.create(key="here", provider="local", max_pods=1, lanes_per_pod=1)
    out, failed = check("here")
    assert failed is not None and "is a local pool, not a RunPod one" in str(failed)
    assert sim.stats()["create_calls"] == 0


def test_it_refuses_a_pool_whose_config_is_not_usable(sim, db):
    Pool.objects.create(key="bad", provider="runpod", max_pods=1, lanes_per_pod=1, config={"image": "x"})
    out, failed = check("bad")
    assert failed is not None and "its config is not usable: candidates" in str(failed)
    assert sim.stats()["create_calls"] == 0
