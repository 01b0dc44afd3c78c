"""bench/ingest.py at a small size: every document accepted, every page read once, each document
sent to the pods about once, and every searchable PDF asked for built (by the outputs workers)."""

from __future__ import annotations

import pytest

from tests.bench.conftest import assert_goals, run_bench


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_ingest_reads_every_page_once_sends_each_document_once_builds_every_pdf_within_the_cpu_ceiling():
    figures = run_bench(
        "ingest.py",
        *("--pdfs", "10", "--pages-per-pdf", "10", "--images", "20", "--pods", "2", "--lanes", "8", "--pdf"),
    )
    assert_goals(
        figures, "every_submission_accepted", "nothing_lost", "nothing_read_twice", "bytes_to_pods_ratio",
        "every_pdf_built", "control_plane_cpu_within_ceiling",
    )  # fmt: skip
    assert figures["pages_done"] == 120 and figures["pdfs_built"] == 30
