"""bench/control_plane.py at a small size: under its load, every probe of the front is answered, and
the control plane's CPU a page stays under its ceiling."""

from __future__ import annotations

import pytest

from tests.bench.conftest import assert_goals, run_bench


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_the_front_answers_every_probe_while_pages_are_in_flight_and_pods_boot_within_the_cpu_ceiling():
    figures = run_bench(
        "control_plane.py",
        *("--pods", "4", "--lanes", "8", "--booting", "4", "--in-flight", "32", "--seconds", "5", "--rate", "10"),
    )
    assert_goals(
        figures,
        "pages_in_flight",
        "pods_booting",
        "nothing_unanswered",
        "no_error_answers",
        "control_plane_cpu_within_ceiling",
    )
