"""fleetadmin/collector.py: a busy loop's run leaves the process's own objects out of the garbage
collector's passes and collects its youngest generation less often; both undone after it."""

from __future__ import annotations

import asyncio
import gc
from types import SimpleNamespace

import pytest

from fleetadmin.collector import GEN0_THRESHOLD, quiet_collector
from ocrjobs.dispatch import loop as dispatch


def test_the_objects_alive_before_are_frozen_and_the_young_collected_less_often_until_the_end():
    before = gc.get_threshold()
    assert gc.get_freeze_count() == 0

    with pytest.raises(RuntimeError), quiet_collector():
        assert gc.get_freeze_count() > 1000  # the process's modules, Django's included
        assert gc.get_threshold() == (GEN0_THRESHOLD, *before[1:])
        raise RuntimeError("the loop failed")

    assert gc.get_freeze_count() == 0 and gc.get_threshold() == before


def test_a_dispatch_loop_runs_with_a_quiet_collector():
    loop = dispatch.DispatchLoop(SimpleNamespace(pool_id=1, token="t", pk=1))
    seen = []

    async def run():
        seen.append((gc.get_freeze_count() > 0, gc.get_threshold()[0]))

    loop._run = run
    asyncio.run(loop.run())

    assert seen == [(True, GEN0_THRESHOLD)]
    assert gc.get_freeze_count() == 0
