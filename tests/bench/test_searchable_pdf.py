"""bench/searchable_pdf.py at a small size: the searchable PDF keeps the original's pages and
sizes, and its text is the pages' lines; its build's CPU a page stays under its ceiling."""

from __future__ import annotations

import pytest

from tests.bench.conftest import assert_goals, run_bench


@pytest.mark.once_sqlite  # the PDF built from stored results: the database only holds them
@pytest.mark.timeout(300)
def test_a_built_searchable_pdf_keeps_the_pages_and_reads_as_the_results_within_the_cpu_ceiling():
    figures = run_bench("searchable_pdf.py", "--pages", "30", "--lines", "10")
    assert_goals(figures, "text_matches", "pages_and_sizes_kept", "control_plane_cpu_within_ceiling")
    assert figures["pages"] == 30 and figures["text_match"] >= 0.99
