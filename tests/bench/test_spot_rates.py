"""bench/spot.py's preemption rate on the storm's compressed clock, and the flags the on-demand run
is not given (the storm itself runs in tests/bench/test_storm_interruptible.py)."""

from __future__ import annotations

import argparse

from bench import spot


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    spot.add_flags(parser)
    return parser.parse_args(list(argv))


def test_the_simulator_preempts_at_the_real_rate_times_the_storms_compression():
    args = _args("--interruptible", "--preempt-rate", "0.3", "--time-scale", "20")
    assert spot.sim_options(args)["preempt_rate_per_hour"] == 6.0  # 30 % of pods a real hour
    assert spot.sim_options(_args("--interruptible", "--preempt-rate", "0.3"))["preempt_rate_per_hour"] == 0.3


def test_the_on_demand_run_is_given_none_of_the_preemption_flags():
    argv = ["--small", "--interruptible", "--preempt-rate", "0.3", "--time-scale=20", "--time-scale", "20",
            "--preempt-share", "0.3", "--max-pods", "8"]  # fmt: skip
    # --time-scale is the storm's too: it divides --realistic's image pulls in both runs alike.
    assert spot.on_demand_argv(argv) == ["--small", "--time-scale=20", "--time-scale", "20", "--max-pods", "8"]
