"""bench/gpu_engine.py at a small size: tesseract and rapidocr read a page through a real pod
server as they read it called directly, and the server fails none."""

from __future__ import annotations

import pytest

from tests.bench.conftest import assert_goals, run_bench


@pytest.mark.e2e
@pytest.mark.once_sqlite  # the pod server and the engines: no database
@pytest.mark.timeout(300)
def test_each_engine_reads_the_page_alike_through_the_pod_server_and_directly():
    figures = run_bench("gpu_engine.py", "--engines", "tesseract,rapidocr", "--pages", "1", "--rounds", "1",
                        database=False)  # fmt: skip
    assert_goals(figures, "every_page_read_both_ways", "same_answer", "nothing_failed")
    assert sorted(engine["engine"] for engine in figures["engines"]) == ["rapidocr", "tesseract"]
