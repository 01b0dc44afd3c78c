"""bench/busy_workers.py at a small size: boots in flight hold no short-task worker, and every
one-page job submitted meanwhile is done, the control plane's CPU a page under its ceiling."""

from __future__ import annotations

import pytest

from tests.bench.conftest import assert_goals, run_bench


@pytest.mark.e2e
# Worker occupancy, once: tests/e2e/test_busy_workers.py holds the same goal (a job done while boots
# are in flight) on both runs.
@pytest.mark.once_sqlite
@pytest.mark.timeout(300)
def test_boots_in_flight_hold_no_short_task_worker_and_every_job_is_done_within_the_cpu_ceiling():
    figures = run_bench(
        "busy_workers.py", *("--boots", "8", "--boot-seconds", "10", "--every", "1", "--idle-jobs", "3")
    )
    assert_goals(
        figures,
        "every_job_done",
        "workers_within_class_sizes",
        "short_workers_never_all_busy",
        "scale_target_reached",
        "control_plane_cpu_within_ceiling",
    )
