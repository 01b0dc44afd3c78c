"""bench/viewer.py at a small size: the job page's first load reads one batch of results and a
fixed number of statements, whatever the job's size, and its HTML stays under 1 MB and its CPU
under its ceiling."""

from __future__ import annotations

import pytest

from tests.bench.conftest import assert_goals, run_bench


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_the_job_page_reads_one_batch_and_a_few_statements_at_any_size_within_the_cpu_ceiling():
    figures = run_bench("viewer.py", "--pages", "300", "--repeats", "3")
    assert_goals(figures, "first_load_under_1_mb", "results_read", "statements", "control_plane_cpu_within_ceiling")
    assert figures["first_load"]["results_read"] == 25 and figures["pages"] == 300
