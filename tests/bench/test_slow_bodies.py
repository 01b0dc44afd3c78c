"""bench/slow_bodies.py at a small size: with 64 slow unauthenticated bodies in flight (half of them
announcing 2 GB, half small ones held on /login/), a real login and a one-page job are answered
(302, 201 and done with its text) and every 2 GB body is refused before it is read (never a time)."""

from __future__ import annotations

import pytest

from tests.bench.conftest import assert_goals, run_bench

# The run is about the front, not the database: once, on the SQLite run.
pytestmark = pytest.mark.once_sqlite


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_a_login_and_a_job_are_answered_while_64_slow_unauthenticated_bodies_are_held():
    figures = run_bench("slow_bodies.py", "--small")
    assert_goals(
        figures, "login_answered_while_held_64", "job_answered_while_held_64", "slow_bodies_held_64",
        "large_refused_before_read_64", "idle_job_done_with_text",
        "control_plane_cpu_within_ceiling",
    )  # fmt: skip
