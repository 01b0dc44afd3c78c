"""Every benchmark under bench/ runs here as a process at a small size (invariant 18).

A test runs ``bench/<name>.py`` with small arguments, reads its closing JSON line and asserts the
goals that do not depend on the machine's speed, by the names the benchmark gives them in its
``"goal"`` object (create calls, pages lost, ratios the simulator's clock drives, ...), and the
control plane's CPU a page (or a unit of the benchmark's work) under a generous ceiling
(``control_plane_cpu_within_ceiling``, bench/_cpu.py): CPU time, which the machine's load barely
moves. Never a time or a rate: those are printed for a reader, and the same JSON says whether
they were met.

On the PostgreSQL run (DATABASE_URL set), a benchmark that needs a database gets one of its own,
``<database>_bench``, created here and flushed by the benchmark: it never touches the suite's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from urllib.parse import urlsplit, urlunsplit

import pytest

from tools.processes import REPO

# A benchmark at its small size takes seconds; this is a guard against a hang, not a goal.
BENCH_TIMEOUT_SECONDS = 420


def bench_database_url() -> str:
    """A PostgreSQL database for benchmarks beside the suite's, or "" on the embedded default."""
    url = os.environ.get("DATABASE_URL", "")
    if not url:
        return ""
    import psycopg

    parts = urlsplit(url)
    name = parts.path.lstrip("/") + "_bench"
    with psycopg.connect(url.replace("postgres://", "postgresql://", 1), autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
            conn.execute(f'CREATE DATABASE "{name}"')
    return urlunsplit(parts._replace(path="/" + name))


def run_bench(script: str, *args: str, database: bool = True, timeout: float = BENCH_TIMEOUT_SECONDS) -> dict:
    """Run ``bench/<script>`` with ``args`` (and the run's database when ``database``); its JSON line."""
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "PYTEST_CURRENT_TEST")}
    argv = [sys.executable, str(REPO / "bench" / script), *args]
    if database and (url := bench_database_url()):
        argv += ["--database-url", url]
    try:
        done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{script} {' '.join(args)} ran past {timeout:.0f} s:\n{_tail(exc.stdout)}\n{_tail(exc.stderr)}")
    if done.returncode != 0:
        pytest.fail(f"{script} {' '.join(args)} exited {done.returncode}:\n{_tail(done.stdout)}\n{_tail(done.stderr)}")
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    try:
        figures = json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        pytest.fail(f"{script} did not end with a JSON line:\n{_tail(done.stdout)}\n{_tail(done.stderr)}")
    assert isinstance(figures.get("goal"), dict), f"{script}'s JSON has no goal object: {figures}"
    assert figures.get("goal_met") == all(figures["goal"].values()), f"goal_met disagrees with goal: {figures}"
    return figures


def assert_goals(figures: dict, *names: str) -> None:
    """Each named goal is in the benchmark's verdict and met; the figures are shown when one is not."""
    missing = [name for name in names if name not in figures["goal"]]
    assert not missing, f"{figures.get('benchmark')} names no goal {missing}: {figures['goal']}"
    unmet = [name for name in names if figures["goal"][name] is not True]
    assert not unmet, f"{figures.get('benchmark')}: goals not met {unmet}\n{json.dumps(figures, indent=1)}"


def _tail(text: str | bytes | None, lines: int = 60) -> str:
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    return "\n".join((text or "").splitlines()[-lines:])
