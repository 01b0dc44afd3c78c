"""bench/dashboard_reads.py at a small size: a push at fleet scale is a fixed number of statements,
none of which reads the page history, and its CPU stays under its ceiling."""

from __future__ import annotations

import pytest

from tests.bench.conftest import assert_goals, run_bench


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_a_push_is_a_few_statements_none_reading_the_page_history_within_the_cpu_ceiling():
    figures = run_bench("dashboard_reads.py", "--repeats", "5")
    assert_goals(figures, "push_statements", "history_not_read", "control_plane_cpu_within_ceiling")
    assert figures["pushes"] == 5 and figures["fleet_pods"] == 500
