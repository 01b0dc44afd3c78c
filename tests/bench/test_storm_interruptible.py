"""bench/storm.py --interruptible at its small size: the on-demand run, then the same storm on
interruptible pods that the simulator preempts (a harsh rate, so that a minute-long run sees some).

Counted goals only: nothing lost, nothing done twice, preemptions seen and recorded. Dollars per
page and makespan against the on-demand run are printed, not asserted: both are wall time here."""

from __future__ import annotations

import pytest

from tests.bench.conftest import assert_goals, run_bench


@pytest.mark.e2e
@pytest.mark.once_postgres  # its subject is preemption, not the database: 3.7 min, run once
@pytest.mark.timeout(900)
def test_a_small_storm_on_preempted_interruptible_pods_loses_nothing_and_does_nothing_twice():
    args = ("--small", "--interruptible", "--preempt-rate", "120", "--preempt-seed", "3")
    figures = run_bench("storm.py", *args, timeout=840)  # two storms: on demand first
    assert_goals(figures, "nothing_lost", "nothing_duplicated", "every_pod_shed", "no_pod_left_at_provider")
    spot = figures["interruptible"]
    assert spot["goal"]["nothing_lost"] and spot["goal"]["nothing_duplicated"]
    assert spot["on_demand_pages_lost"] == 0
    assert spot["pods_interruptible"] >= 1 and spot["preemptions_at_simulator"] >= 1
    assert 1 <= spot["preemptions"] <= spot["preemptions_at_simulator"]
    assert figures["pages_by_status"] == {"done": figures["pages"]}
