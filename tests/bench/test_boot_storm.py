"""bench/boot_storm.py at a small size: a storm of boots probes each candidate about once, and
the passes' CPU a boot stays under its ceiling."""

from __future__ import annotations

import pytest

from tests.bench.conftest import assert_goals, run_bench


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_a_boot_storm_makes_no_more_create_calls_than_candidates_and_boots_within_the_cpu_ceiling():
    figures = run_bench("boot_storm.py", "--boots", "12", "--gpu-types", "4", "--data-centers", "4")
    assert_goals(figures, "create_calls", "catalogue_fetches", "boots_succeeded", "control_plane_cpu_within_ceiling")
    assert figures["boots_succeeded"] == 12 and figures["candidates"] == 16


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_a_realistic_boot_storm_walks_every_wording_and_429_within_its_create_calls():
    """The simulator as hard as RunPod (issue 39): 429s, gateway pages, capacity in every wording,
    null creates, image pulls of minutes (seconds at this time scale). Create calls stay within candidates + boots + the calls answered 429 or a gateway
    page, and no candidate is refused in words the provider does not know."""
    figures = run_bench(
        "boot_storm.py", "--boots", "12", "--gpu-types", "4", "--data-centers", "4", "--capacity", "2",
        "--realistic", "--seed", "1", "--time-scale", "60",
    )  # fmt: skip
    assert figures["realistic"] is True
    assert_goals(figures, "create_calls", "no_refusal_in_unknown_words", "boots_succeeded")
