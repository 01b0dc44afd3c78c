"""bench/hostile.py at a small size: with a trickling webhook receiver, trickling URL hosts and
slow clients on the front all at once, the one-page jobs are done with their text, every URL
document ends failed at its deadline, and the receiver's attempt is recorded; the control plane's
CPU a second under them stays under its ceiling (never a time)."""

from __future__ import annotations

import pytest

from tests.bench.conftest import assert_goals, run_bench

# The run is about the front, the workers and remote peers, not the database: once, on the SQLite run.
pytestmark = pytest.mark.once_sqlite


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_hostile_parties_lose_nothing_and_every_remote_wait_ends_at_its_deadline_within_the_cpu_ceiling():
    figures = run_bench("hostile.py", "--small")
    assert_goals(
        figures, "nothing_lost", "url_documents_ended", "webhook_attempt_recorded", "control_plane_cpu_within_ceiling"
    )
    assert figures["engaged"]["webhook_receiver_connected"] and figures["engaged"]["url_hosts_connected"] >= 1
