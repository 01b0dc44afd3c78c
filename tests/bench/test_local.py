"""bench/local.py at a small size: the embedded default (``manage.py up``, then ``manage.py ocr``)
reads every page of a scanned PDF and gives the bare engine's text, on a pod kept warm before
the job came, the control plane's CPU a page under its ceiling. Never its time or ratio."""

from __future__ import annotations

import pytest

from tests.bench.conftest import assert_goals, run_bench


@pytest.mark.e2e
@pytest.mark.timeout(600)
@pytest.mark.once_sqlite  # the embedded default is SQLite's
def test_the_embedded_default_reads_every_page_with_the_bare_engines_text_within_the_cpu_ceiling():
    figures = run_bench("local.py", "--pages", "2", database=False)
    assert_goals(figures, "every_page_read", "same_text", "warm_pod", "control_plane_cpu_within_ceiling")
    (round_,) = figures["rounds"]
    assert round_["pages_done_project"] == round_["pages_read_bare"] == 2
    assert round_["char_accuracy"] >= 0.99
