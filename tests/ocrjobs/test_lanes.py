"""The lane table: a lease answers at once, with a lane or the reason there is none."""

from __future__ import annotations

from ocrjobs.dispatch import lanes as lanes_mod
from ocrjobs.dispatch.lanes import FleetCounts, LaneTable


def _table(pods: int, lanes: int) -> LaneTable:
    table = LaneTable()
    table.sync([(n, f"http://pod-{n}", lanes, "") for n in range(pods)], FleetCounts(ready=pods))
    return table


def test_leases_spread_across_pods_and_stop_at_the_lanes_there_are():
    table = _table(3, 2)
    leased = [table.lease() for _ in range(6)]
    assert [lane.pod_id for lane in leased[:3]] == [0, 1, 2]
    assert table.lease() is None and table.free == 0
    assert table.why_none() == "all at their cap (6/6 lanes in use)"
    table.release(leased[0])
    assert table.free == 1 and table.lease() is leased[0]


def test_a_pod_that_leaves_gives_no_more_lanes_and_its_leases_can_still_be_released():
    table = _table(2, 2)
    held = table.lease()
    table.sync([(1, "http://pod-1", 2, "")], FleetCounts(ready=1))
    assert table.total == 2 and table.free == 2
    leased = [table.lease(), table.lease()]
    assert {lane.pod_id for lane in leased} == {1}
    assert table.lease() is None
    table.release(held)  # a forward to the departed pod ends later
    assert table.free == 0


def test_a_smaller_share_of_lanes_takes_effect_without_losing_any():
    table = _table(1, 4)
    first = table.lease()
    table.sync([(0, "http://pod-0", 2, "")], FleetCounts(ready=1))  # a second dispatcher now shares the pod
    assert (table.total, table.free) == (2, 1)
    assert table.lease() is not None and table.lease() is None
    table.release(first)
    table.sync([(0, "http://pod-0", 4, "")], FleetCounts(ready=1))  # alone again
    assert table.free == 3
    assert sum(1 for _ in iter(table.lease, None)) == 3


def test_the_reason_says_why_no_lane_is_free():
    table = LaneTable()
    assert table.why_none() == "no pods"
    table.sync([], FleetCounts(booting=2))
    assert table.why_none() == "none healthy (2 booting)"
    table.sync([], FleetCounts(draining=1))
    assert table.why_none() == "all draining (1)"


def test_a_preferred_pod_gives_its_lane_while_it_has_one_then_any_pod_does():
    table = _table(3, 2)
    assert [table.lease([2], anywhere=False).pod_id for _ in range(2)] == [2, 2]
    assert table.lease([2], anywhere=False) is None  # its lanes are taken; nothing else asked for
    assert table.lease([2]).pod_id in (0, 1)
    assert table.free == 3


def test_leases_on_preferred_pods_never_grow_the_free_list_past_the_lanes_there_are():
    table = _table(2, 3)
    for _ in range(1000):  # every page goes to the pod that holds its document, over and over
        table.release(table.lease([1]))
    assert all(pod.queued <= pod.lanes for pod in table.pods.values())
    assert len(table._free) <= table.total
    assert sum(1 for _ in iter(table.lease, None)) == 6  # and every lane is still there to lease


def test_a_lease_from_the_free_lanes_side_takes_a_wanted_pod_among_the_next_few_and_counts_it():
    table = _table(4, 1)
    lane = table.lease_where(lambda pod_id: pod_id == 2)
    assert lane.pod_id == 2 and table.free == 3
    assert table.lease_where(lambda pod_id: pod_id == 2) is None  # its one lane is out
    assert sorted(table.lease().pod_id for _ in range(3)) == [0, 1, 3]  # its stale entry skipped
    assert table.lease() is None
    table.release(lane)
    assert table.free == 1 and table.lease().pod_id == 2


def test_a_lease_from_the_free_lanes_side_looks_no_further_than_free_looks():
    table = _table(lanes_mod.FREE_LOOKS + 4, 1)
    far = lanes_mod.FREE_LOOKS + 2  # its free lane is further down than a look goes
    assert table.lease_where(lambda pod_id: pod_id == far) is None
    assert table.free == table.total
