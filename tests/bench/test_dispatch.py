"""bench/dispatch.py at a small size: no page lost or read twice, and a lease flat with the fleet;
and at fleet scale, 64 pods x 8 lanes behind one gateway: every lane kept busy (achieved ÷ ideal).
Both sizes with the dispatcher's CPU a page under a generous ceiling (invariant 18)."""

from __future__ import annotations

import pytest

from tests.bench.conftest import assert_goals, run_bench


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_one_dispatcher_loses_no_page_reads_none_twice_within_its_cpu_ceiling():
    figures = run_bench("dispatch.py", "--pods", "4", "--lanes", "8", "--pages", "1000")
    assert_goals(figures, "nothing_lost", "nothing_read_twice", "control_plane_cpu_within_ceiling")
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


@pytest.mark.e2e
@pytest.mark.once_sqlite  # ~30 s: once, not on each database
@pytest.mark.timeout(300)
def test_64_pods_x_8_lanes_behind_one_gateway_keep_every_lane_busy_at_a_small_cpu_cost_a_page():
    # Pods sharing one host and port, as behind a gateway (--gateway): a cap on connections per
    # host left half the lanes idle (main at 8630753: 0.499 of the ideal past the first round,
    # 0.477 in all), and a host per pod would hide it. 8 rounds of 2 s; the goal is the rounds
    # after the first (steady_over_ideal): the start-up, ~2 s here, is the larger run's to amortize.
    # The CPU a page (0.70 ms here; main 1.05 ms) under bench/dispatch.py's ceiling, 2.1 ms.
    # A job of 8 documents of 512 pages: claimed a document after another (main at d1196e8), each
    # went to half the fleet, 320 copies (4.88 a pod past each document's first); claimed in
    # strips, 64 (0.88): documents_spread_thin.
    figures = run_bench("dispatch.py", "--pods", "64", "--lanes", "8", "--latency", "2", "--pages", "4096", "--gateway",
                        "--document-pages", "512")  # fmt: skip
    assert_goals(figures, "nothing_lost", "nothing_read_twice", "steady_over_ideal", "control_plane_cpu_within_ceiling",
                 "documents_spread_thin")  # fmt: skip
    assert figures["pod_urls"] == "gateway" and figures["documents"] == 8


@pytest.mark.e2e
@pytest.mark.once_sqlite  # ~15 s: the routing, the same on each database
@pytest.mark.timeout(300)
def test_many_short_documents_keep_every_lane_busy():
    # 128 documents of 20 pages over 32 pods x 8 lanes, as a batch of ordinary PDFs comes. When
    # the loop looked at the next 32 pages for its choice, it saw the first two documents, whose
    # pods were busy, and none of the others: the other pods idled (main at 3490100: 0.308 of the
    # ideal past the first round, 0.30 in all; 0.991 and 0.971 after).
    figures = run_bench("dispatch.py", "--pods", "32", "--lanes", "8", "--latency", "1", "--pages", "2560",
                        "--document-pages", "20")  # fmt: skip
    assert_goals(figures, "nothing_lost", "nothing_read_twice", "control_plane_cpu_within_ceiling")
    # Not the bench's goal of 0.95, which a machine 2.3x slower missed at main too (0.94-0.975 on
    # 2026-12-06, night, with 256 pages a second through one process on two cores): the routing
    # this guards against gave 0.308.
    assert figures["steady_over_ideal"] >= 0.8, figures
    assert figures["documents"] == 128
