"""bench/storm.py at its small size (--small), in both modes: the counted goals, and the control
plane's CPU a page under its ceiling.

Paid ÷ busy is not asserted: the pods' billed and busy seconds are wall time (the simulator's
boots and pages take real seconds), so the ratio moves with the machine's load."""

from __future__ import annotations

import pytest

from tests.bench.conftest import assert_goals, run_bench

COUNTED = (
    "nothing_lost",
    "nothing_duplicated",
    "no_growth_while_stalled",
    "every_ready_pod_read_pages",
    "create_calls",
    "catalogue_fetches",
    "status_answered",
    "every_pod_shed",
    "no_pod_left_at_provider",
    # CPU time, not wall time: the control plane's CPU a page under a generous ceiling.
    "control_plane_cpu_within_ceiling",
)


@pytest.mark.e2e
@pytest.mark.once_postgres  # the fleet's sizing on stored pages; the submission path's storm runs on both
@pytest.mark.timeout(420)
def test_a_small_storm_of_stored_pages_loses_nothing_and_leaves_no_pod_within_the_cpu_ceiling():
    figures = run_bench("storm.py", "--small")
    assert_goals(figures, *COUNTED)
    assert figures["pages_by_status"] == {"done": figures["pages"]} and figures["pods_booted"] >= 1


@pytest.mark.e2e
@pytest.mark.timeout(420)
def test_a_small_storm_through_the_submission_path_loses_nothing_and_leaves_no_pod_within_the_cpu_ceiling():
    figures = run_bench("storm.py", "--small", "--real-path")
    assert_goals(figures, *COUNTED)
    assert figures["pages_by_status"] == {"done": figures["pages"]} and figures["pods_booted"] >= 1


@pytest.mark.e2e
@pytest.mark.once_postgres  # its subject is RunPod's faults, not the database: run once
@pytest.mark.timeout(420)
def test_a_small_storm_on_a_simulator_as_hard_as_runpod_loses_nothing_and_no_boot_ends_on_a_transient_read():
    # Image pulls of minutes at the storm's time scale (bench/spot.py: 20 makes its boot a real one).
    figures = run_bench("storm.py", "--small", "--realistic", "--time-scale", "20")
    assert_goals(figures, *COUNTED, "no_boot_ended_by_a_transient_read")
    assert figures["pages_by_status"] == {"done": figures["pages"]}
