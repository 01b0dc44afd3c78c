"""bench/cascade.py at a small size: two pages of each degradation read by tesseract and rapidocr in
this process; the cascade at a given threshold is at least as accurate as the better engine alone
(its cost is a measurement, printed, not asserted)."""

from __future__ import annotations

import pytest

from tests.bench.conftest import assert_goals, run_bench


@pytest.mark.e2e
@pytest.mark.timeout(420)
def test_the_cascade_is_as_accurate_as_the_better_engine_on_degraded_pages():
    figures = run_bench("cascade.py", "--pages", "10", "--threshold", "50", database=False)
    assert_goals(figures, "every_page_read", "every_kind_degraded", "as_accurate_as_the_better_engine")
    assert figures["pages"] == 10 and figures["threshold"] == 50
    assert {kind: row["pages"] for kind, row in figures["by_kind"].items()} == {
        "clean": 2, "noise": 2, "blur": 2, "lowres": 2, "rotation": 2,
    }  # fmt: skip
