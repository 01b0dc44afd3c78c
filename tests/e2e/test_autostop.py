"""Issue 39's goal, on real processes: with four pods up in the simulator and a job running,
kill -9 of every control-plane process (the front and the whole worker tree). Every pod stops
billing within its autostop interval plus a minute, and a restart of the control plane reconciles
them with nothing lost: each ended as stopped by itself (not failed, not lost), every page done
once, and no page attempt spent on the pods that stopped.

The interval is short for the test (AUTOSTOP seconds; a pool's default is 600)."""

from __future__ import annotations

import time

import pytest

from ocrjobs.models import Page
from pods.enqueue import nudge_scaler
from pods.models import Pod
from tests.assertions import assert_every_page_done_once
from tests.e2e.test_process_faults import (  # noqa: F401 (fixtures)
    GUARD,
    assert_no_pod_unaccounted,
    frames,
    kill_tree,
    pages_done,
    sim_pool,
    start_system,
    wait_until_finished,
)
from tools.processes import start_front, start_workers, wait_for

# Its subject is the processes and the provider, not the database: once, on the SQLite run.
pytestmark = [pytest.mark.e2e, pytest.mark.once_sqlite]

AUTOSTOP = 5  # seconds
PODS = 4


def test_every_pod_stops_billing_when_the_control_plane_is_killed_and_a_restart_loses_nothing(sim, start_system):  # noqa: F811
    system = start_system()
    pool = sim_pool(min_pods=PODS, max_pods=PODS, autostop_seconds=AUTOSTOP)
    job = system.submit({"scan.tiff": frames(320)}, pool)
    ready = Pod.objects.filter(pool=pool, state=Pod.State.READY)
    wait_for(lambda: ready.count() == PODS and pages_done(job) >= 10, GUARD,
             lambda: f"never {PODS} pods up mid job\n{system.logs()}", interval=0.05)  # fmt: skip
    first_pods = set(ready.values_list("provider_id", flat=True))

    # Every control-plane process, at once.
    system.front.popen.kill()
    kill_tree(system.cluster())
    killed_at = time.monotonic()
    assert job.pages.exclude(status=Page.Status.DONE).exists(), "the job ended before the kill"
    # Out at the pods when they were left alone (others the dead dispatcher held in its own queue:
    # their claims lapse and spend an attempt, as with any dispatcher killed with -9).
    at_the_pods = set(
        job.pages.filter(status=Page.Status.RUNNING, pod__provider_id__in=first_pods).values_list("pk", flat=True)
    )

    def billing() -> list[str]:
        return [pod["id"] for pod in sim.pods() if pod["id"] in first_pods and pod["billing"]]

    wait_for(lambda: not billing(), AUTOSTOP + 60, lambda: f"still billing a minute past the interval: {billing()}")
    stopped_after = time.monotonic() - killed_at
    print(f"every pod stopped billing {stopped_after:.1f} s after the kill (autostop {AUTOSTOP} s)")
    assert all(pod["autostopped"] for pod in sim.pods() if pod["id"] in first_pods)

    # The control plane comes back, and is nudged as `manage.py up` nudges every pool when it starts.
    log_dir = system.var_dir / "restarted"
    log_dir.mkdir()
    system.workers = start_workers(system.env, log_dir)
    system.old_fronts.append(system.front)
    system.front, system.url = start_front(system.env, log_dir)
    nudge_scaler(pool.pk)

    wait_until_finished(system, job)
    assert_every_page_done_once(job)
    first = Pod.objects.filter(pool=pool, provider_id__in=first_pods)
    assert {(pod.state, pod.error.split(":")[0]) for pod in first} == {(Pod.State.TERMINATED, "autostopped")}
    assert not Pod.objects.filter(pool=pool, state__in=(Pod.State.FAILED, Pod.State.LOST)).exists()
    # The pages out at the stopped pods had their attempts given back: read on their first.
    assert at_the_pods, "no page was out at a pod when the control plane died"
    assert set(job.pages.filter(pk__in=at_the_pods).values_list("attempts", flat=True)) == {1}
    assert_no_pod_unaccounted("runpod")  # the stopped pods' remains were terminated at the provider
