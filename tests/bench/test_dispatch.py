"""bench/dispatch.py at a small size: no page lost or read twice, and a lease flat with the fleet."""

from __future__ import annotations

import pytest

from tests.bench.conftest import assert_goals, run_bench


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_one_dispatcher_loses_no_page_and_reads_none_twice():
    figures = run_bench("dispatch.py", "--pods", "4", "--lanes", "8", "--pages", "1000")
    assert_goals(figures, "nothing_lost", "nothing_read_twice")
    assert figures["pages_done"] == 1000


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_two_dispatchers_lose_no_page_and_read_none_twice():
    figures = run_bench("dispatch.py", "--pods", "4", "--lanes", "8", "--pages", "1000", "--dispatchers", "2")
    assert_goals(figures, "nothing_lost", "nothing_read_twice")


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_pods_with_latency_lose_no_page_and_read_none_twice():
    figures = run_bench("dispatch.py", "--latency", "0.2", "--lanes", "4", "--pages", "160")
    assert_goals(figures, "nothing_lost", "nothing_read_twice")


@pytest.mark.e2e
@pytest.mark.once_sqlite  # a lease's steps, counted without a database
@pytest.mark.timeout(120)
def test_a_lease_executes_as_many_steps_at_512_pods_as_at_8_and_a_pages_route_as_at_128():
    figures = run_bench("dispatch.py", "--lease-only", database=False)
    assert_goals(figures, "lease_steps_flat", "preferred_lease_steps_flat", "route_steps_flat")
