"""bench/status_history.py at a small size: with a week of pages behind it, no read the status,
the dashboard, /metrics, a job page or a push makes reads the history, and a push at fleet scale
stays within 64 KiB and under its CPU ceiling."""

from __future__ import annotations

import pytest

from tests.bench.conftest import assert_goals, run_bench


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_the_status_and_the_dashboard_do_not_read_the_page_history_within_the_cpu_ceiling():
    figures = run_bench("status_history.py", "--pages", "20000", "--recent", "200", "--repeats", "5")
    assert_goals(figures, "history_not_read", "push_within_64_kib", "control_plane_cpu_within_ceiling")
    assert figures["pages"] == 20000 and figures["fleet_push_with_index"]["pod_page_rows"] == 50
