"""bench/uploads.py at a small size: the front stores every job and document it is sent,
its CPU a page under its ceiling."""

from __future__ import annotations

import pytest

from tests.bench.conftest import assert_goals, run_bench


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_the_front_accepts_and_stores_every_job_and_document_within_the_cpu_ceiling():
    figures = run_bench(
        "uploads.py", *("--pdfs", "10", "--pages-per-pdf", "10", "--images", "20", "--docs-per-job", "3")
    )
    assert_goals(
        figures,
        "every_submission_accepted",
        "every_job_stored",
        "every_document_stored",
        "control_plane_cpu_within_ceiling",
    )
    assert figures["documents_stored"] == 30 and figures["jobs_stored"] == 10
