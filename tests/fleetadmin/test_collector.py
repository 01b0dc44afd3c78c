"""fleetadmin/collector.py: a busy loop's run leaves the process's own objects out of the garbage
collector's passes and collects its youngest generation less often; both undone after it."""

from __future__ import annotations

import gc

import pytest

from fleetadmin.collector import GEN0_THRESHOLD, quiet_collector


def test_the_objects_alive_before_are_frozen_and_the_young_collected_less_often_until_the_end():
    before = gc.get_threshold()
    assert gc.get_freeze_count() == 0

    with pytest.raises(RuntimeError), quiet_collector():
        assert gc.get_freeze_count() > 1000  # the process's modules, Django's included
        assert gc.get_threshold() == (GEN0_THRESHOLD, *before[1:])
        raise RuntimeError("the loop failed")

    assert gc.get_freeze_count() == 0 and gc.get_threshold() == before
