"""bench/searchable_pdf.py's memory goal at a small size: building the searchable PDF grows the
heap by less than a kilobyte a page between its chunks (it grew ~16 kB a page when qpdf held the
whole document), counted from glibc's heap at each chunk's end, not from a sampled peak."""

from __future__ import annotations

import pytest

from tests.bench.conftest import assert_goals, run_bench


@pytest.mark.timeout(300)
def test_a_searchable_pdfs_build_holds_a_chunk_of_pages_not_the_document():
    figures = run_bench("searchable_pdf.py", "--pages", "300", "--lines", "5")
    assert_goals(figures, "heap_bounded_by_a_chunk", "text_matches")
    assert figures["heap_growth_per_page_bytes"] is not None
