"""bench/storage.py at a small size: a document stored on a real S3 server reads back as it was
stored, and every page's result is stored in its row, its CPU a page under its ceiling."""

from __future__ import annotations

import pytest

from tests.bench.conftest import assert_goals, run_bench


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_documents_read_back_from_s3_and_results_are_stored_in_their_rows_within_the_cpu_ceiling():
    figures = run_bench("storage.py", "--document-mb", "16", "--reads", "20", "--pages", "500")
    assert_goals(
        figures, "document_read_back", "document_on_the_s3_server", "results_stored", "control_plane_cpu_within_ceiling"
    )
    assert figures["results_stored"] == 500 and figures["image_reads_read_back"] == 20
