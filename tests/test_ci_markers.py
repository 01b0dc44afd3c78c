"""once_sqlite / once_postgres (tests/conftest.py): a marked test runs on one of CI's two runs and
is skipped, saying where it runs, on the other. A pytest started here on this file's two probes,
with DATABASE_URL unset and set, shows the hook registered and taking effect."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import pytest_collection_modifyitems
from tools.processes import REPO

PROBES = [f"{__file__}::test_probe_once_sqlite", f"{__file__}::test_probe_once_postgres"]
RUN_GUARD = 180  # seconds, against hangs only
NOWHERE = "postgres://nobody@127.0.0.1:9/none"  # a PostgreSQL run's settings; never connected to


@pytest.mark.once_sqlite
def test_probe_once_sqlite():
    assert not os.environ.get("DATABASE_URL")


@pytest.mark.once_postgres
def test_probe_once_postgres():
    assert os.environ.get("DATABASE_URL")


def run_probes(database_url: str) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "PYTEST_CURRENT_TEST")}
    if database_url:
        env |= {"DATABASE_URL": database_url, "SECRET_KEY": env.get("SECRET_KEY") or "ci-markers-only"}
    argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-v", "-rs", "--no-header", *PROBES]
    done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=RUN_GUARD)
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.mark.parametrize(
    ("database_url", "runs", "skipped"),
    [
        ("", "test_probe_once_sqlite", "runs once, on the PostgreSQL + Redis run (once_postgres)"),
        (NOWHERE, "test_probe_once_postgres", "runs once, on the SQLite run (once_sqlite)"),
    ],
    ids=["sqlite-run", "postgresql-run"],
)
def test_a_marked_test_runs_on_its_database_only_and_the_skip_says_where(database_url, runs, skipped):
    out = run_probes(database_url)
    assert "1 passed, 1 skipped" in out, out
    (other,) = {probe.rsplit("::", 1)[1] for probe in PROBES} - {runs}
    assert f"::{runs} PASSED" in out, out
    assert f"::{other} SKIPPED" in out, out
    assert f": {skipped}\n" in out, out  # -rs: the reason, in full


class Item:
    """What the hook reads of a collected test: its node id and markers."""

    def __init__(self, *markers: str):
        self.nodeid = f"probe[{','.join(markers)}]"
        self.markers = [getattr(pytest.mark, name) for name in markers]

    def get_closest_marker(self, name):
        return next((mark for mark in self.markers if mark.name == name), None)

    def add_marker(self, mark):
        self.markers.append(mark)


def test_a_test_marked_for_both_runs_is_refused_rather_than_never_run(monkeypatch):
    monkeypatch.delenv("DATABASE_URL", raising=False)
    with pytest.raises(pytest.UsageError, match="once_sqlite and once_postgres: it would never run"):
        pytest_collection_modifyitems(None, [Item("once_sqlite", "once_postgres")])
