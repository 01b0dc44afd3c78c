"""bench/cascade.py at a small size: one page of each degradation, read by tesseract and rapidocr in
this process; the cascade at a given threshold escalates some pages and keeps some, and is at least
as accurate as the better engine alone (its cost is a measurement, printed, not asserted)."""

from __future__ import annotations

import pytest

from tests.bench.conftest import assert_goals, run_bench


@pytest.mark.e2e
@pytest.mark.timeout(420)
def test_the_cascade_is_as_accurate_as_the_better_engine_on_degraded_pages():
    figures = run_bench("cascade.py", "--pages", "5", "--threshold", "90", database=False)
    assert_goals(figures, "every_page_read", "every_kind_degraded", "escalated_some_not_all",
                 "as_accurate_as_the_better_engine")  # fmt: skip
    assert figures["pages"] == 5 and figures["threshold"] == 90
    assert set(figures["by_kind"]) == {"clean", "noise", "blur", "lowres", "rotation"}
