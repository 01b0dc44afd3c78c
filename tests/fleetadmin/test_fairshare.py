"""fleetadmin/fairshare.py: shared slots taken in turn by owner, with a cap per owner and per
host, decided on plain values (review N6)."""

from __future__ import annotations

from fleetadmin.fairshare import Held, Waiting, host_of, take_turns


def flood(owner: str, count: int, start: int = 0, host: str = "") -> list[Waiting]:
    return [Waiting(start + n, owner, host or f"{owner}-{n}.example") for n in range(count)]


def test_a_thousand_waiting_of_one_owner_leave_the_next_slot_to_another_owner():
    waiting = flood("a", 1000) + [Waiting(5000, "b", "b.example")]
    assert take_turns(held=[Held("a", "a-x.example")], waiting=waiting, slots=2, per_owner=2) == [5000]


def test_owners_take_free_slots_in_turn_oldest_wait_first():
    waiting = flood("a", 5) + flood("b", 5, start=100) + flood("c", 5, start=200)
    assert take_turns(held=[], waiting=waiting, slots=6, per_owner=10) == [0, 100, 200, 1, 101, 201]


def test_an_owner_at_their_cap_waits_even_with_slots_free():
    assert take_turns(held=[Held("a")], waiting=flood("a", 10), slots=4, per_owner=2) == [0]
    assert take_turns(held=[Held("a"), Held("a")], waiting=flood("a", 10), slots=4, per_owner=2) == []


def test_a_host_at_its_cap_is_skipped_for_the_owners_next_item_on_another_host():
    waiting = [Waiting(1, "a", "tarpit.example"), Waiting(2, "a", "tarpit.example"), Waiting(3, "a", "ok.example")]
    held = [Held("b", "tarpit.example")]
    assert take_turns(held=held, waiting=waiting, slots=4, per_owner=4, per_host=1) == [3]


def test_no_slot_free_takes_nothing():
    assert take_turns(held=[Held("a"), Held("b")], waiting=flood("c", 3), slots=2, per_owner=1) == []


def test_host_of_keeps_the_host_only():
    assert host_of("https://Docs.Example.com:8443/a.pdf?x=1") == "docs.example.com"
    assert host_of("http://[::1]:80/") == "::1"
    assert host_of("not a url") == ""


def test_among_owners_holding_as_many_the_one_served_longest_ago_goes_first():
    waiting = flood("a", 3) + flood("b", 3, start=100)
    assert take_turns(held=[], waiting=waiting, slots=1, per_owner=1, served={"a": 20.0, "b": 10.0}) == [100]
    assert take_turns(held=[], waiting=waiting, slots=1, per_owner=1, served={"a": 20.0}) == [100]  # never: first
    assert take_turns(held=[], waiting=waiting, slots=2, per_owner=2, served={"a": 5.0, "b": 10.0}) == [0, 100]
