"""bench/compare.py on the quickest benchmark (a lease's cost, no database): both trees run, every
figure gets its ratio, and the worktree it made is gone afterwards."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.bench.conftest import assert_goals, run_bench
from tools.processes import REPO


@pytest.mark.e2e
@pytest.mark.once_sqlite  # the lease's cost takes no database
@pytest.mark.timeout(120)
def test_compare_runs_the_benchmark_on_both_trees_and_gives_every_figure_its_ratio():
    figures = run_bench("compare.py", "HEAD", "--rounds", "1", "--", "bench/dispatch.py", "--lease-only",
                        database=False)  # fmt: skip
    assert_goals(figures, "every_run_ended")
    table = figures["figures"]
    assert "lease_steps.512" in table and "microseconds.512" in table
    for name, row in table.items():
        assert len(row["ref"]) == len(row["work"]) == 1, name
        assert row["ratio"] == round(row["work"][0] / row["ref"][0], 3), name
    assert not Path(figures["worktree"]).exists()
    listed = subprocess.run(["git", "worktree", "list"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    assert figures["worktree"] not in listed
