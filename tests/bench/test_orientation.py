"""bench/orientation.py at a small size: one page read turned four ways and skewed both ways reads
within 5% of its upright (or level) reading, with its rotation and skew recorded."""

from __future__ import annotations

import pytest

from tests.bench.conftest import assert_goals, run_bench


@pytest.mark.e2e
@pytest.mark.once_sqlite  # the engine alone: no database
@pytest.mark.timeout(300)
def test_a_page_turned_or_skewed_reads_as_well_as_upright():
    figures = run_bench("orientation.py", "--pages", "1", "--skews=-3,2", database=False)
    assert_goals(figures, "every_turn_within_5_pct", "every_skew_within_5_pct", "rotation_recorded",
                 "skew_recorded", "no_warning")  # fmt: skip
    assert set(figures["accuracy_by_turn"]) == {"0", "90", "180", "270"}
