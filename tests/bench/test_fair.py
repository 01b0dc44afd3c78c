"""bench/fair.py at a small size: one user's slow URLs, tarpit callbacks and rebuild storm leave
another user's URL document, webhook and searchable PDF their turn (counted, never a time), lose
nothing, and the control plane's CPU a second under them stays under its ceiling."""

from __future__ import annotations

import pytest

from tests.bench.conftest import assert_goals, run_bench

# The run is about the workers' shared slots and remote peers, not the database: once, on SQLite.
pytestmark = pytest.mark.once_sqlite


@pytest.mark.e2e
@pytest.mark.timeout(420)
def test_one_users_flood_and_rebuild_storm_leave_another_user_their_turn_and_lose_nothing():
    figures = run_bench("fair.py", "--small")
    assert_goals(
        figures,
        "victim_url_not_behind_flood",
        "victim_webhook_not_behind_flood",
        "victim_pdf_not_behind_storm",
        "nothing_lost",
        "control_plane_cpu_within_ceiling",
    )
    assert figures["engaged"] == {"url_tarpit": True, "hook_tarpit": True}
