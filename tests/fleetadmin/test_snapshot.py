"""fleetadmin.snapshot: a read computed at most once per max_age, once for concurrent callers,
refreshed ahead on its own thread."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from fleetadmin.snapshot import Snapshot


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _eventually(predicate, what: str) -> None:
    deadline = time.monotonic() + 10
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.005)


def test_a_value_is_served_until_it_is_older_than_max_age_then_computed_again():
    clock, calls = Clock(), []
    snapshot = Snapshot(lambda: calls.append(clock.now) or len(calls), max_age=1.0, refresh_after=1.0, clock=clock)

    assert snapshot.get() == 1
    clock.now += 1.0
    assert snapshot.get() == 1  # exactly max_age old
    clock.now += 0.001
    assert snapshot.get() == 2
    assert calls == [100.0, 101.001] and snapshot.computations == 2


def test_age_counts_from_the_start_of_the_computation():
    clock = Clock()

    def slow() -> float:
        started = clock.now
        clock.now += 0.8  # the reads took 0.8 s
        return started

    snapshot = Snapshot(slow, max_age=1.0, refresh_after=1.0, clock=clock)
    assert snapshot.get() == 100.0
    clock.now += 0.3  # 1.1 s after the reads began, 0.3 s after they ended
    assert snapshot.get() == pytest.approx(101.1)  # computed again


def test_concurrent_callers_wait_for_the_one_computation_in_progress():
    release, started = threading.Event(), threading.Event()
    calls = []

    def compute() -> dict:
        calls.append(threading.current_thread().name)
        started.set()
        assert release.wait(10)
        return {"n": len(calls)}

    snapshot = Snapshot(compute, max_age=60.0)
    with ThreadPoolExecutor(8) as pool:
        first = pool.submit(snapshot.get)
        assert started.wait(10)
        others = [pool.submit(snapshot.get) for _ in range(7)]
        assert not any(f.done() for f in others)  # they wait for it rather than computing
        release.set()
        values = [first.result(10)] + [f.result(10) for f in others]
    assert len(calls) == 1
    assert all(value is values[0] for value in values) and values[0] == {"n": 1}


def test_past_refresh_after_callers_get_the_value_at_once_while_one_refresh_runs_on_its_thread():
    clock, release = Clock(), threading.Event()
    threads, closed = [], []

    def compute() -> int:
        threads.append(threading.current_thread().name)
        if len(threads) > 1:
            assert release.wait(10)
        return len(threads)

    snapshot = Snapshot(compute, max_age=1.0, refresh_after=0.5, after_refresh=lambda: closed.append(1),
                        name="fleet-test", clock=clock)  # fmt: skip
    assert snapshot.get() == 1  # the first value: computed by its caller
    clock.now += 0.6
    assert [snapshot.get() for _ in range(5)] == [1] * 5  # nobody waits; one refresh started
    _eventually(lambda: len(threads) == 2, "no refresh started")
    release.set()
    _eventually(lambda: closed, "the refresh did not finish")
    assert snapshot.get() == 2 and snapshot.computations == 2
    assert threads[0] == threading.current_thread().name and threads[1].startswith("fleet-test")


def _second_computation_stalls():
    """compute() counting its calls; the second says it started, then waits for release."""
    release, started = threading.Event(), threading.Event()
    calls = []

    def compute() -> int:
        calls.append(1)
        if len(calls) == 2:
            started.set()
            assert release.wait(10)
        return len(calls)

    return compute, calls, started, release


def test_a_caller_past_max_age_waits_for_the_refresh_in_progress_instead_of_computing():
    clock = Clock()
    compute, calls, started, release = _second_computation_stalls()
    snapshot = Snapshot(compute, max_age=1.0, refresh_after=0.5, clock=clock)
    snapshot.get()
    clock.now += 0.6
    assert snapshot.get() == 1
    assert started.wait(10)
    clock.now += 0.6  # the value is now 1.2 s old
    with ThreadPoolExecutor(1) as pool:
        late = pool.submit(snapshot.get)
        time.sleep(0.05)
        assert not late.done()
        release.set()
        assert late.result(10) == 2
    assert len(calls) == 2


def test_a_failed_computation_is_not_kept_and_the_next_caller_computes():
    outcomes = iter([RuntimeError("database went away"), "fresh"])

    def compute() -> str:
        outcome = next(outcomes)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    snapshot = Snapshot(compute, max_age=60.0)
    with pytest.raises(RuntimeError):
        snapshot.get()
    assert snapshot.get() == "fresh" and snapshot.computations == 1


def test_clear_forgets_the_value_and_any_computation_in_progress():
    clock = Clock()
    compute, _, started, release = _second_computation_stalls()
    snapshot = Snapshot(compute, max_age=1.0, refresh_after=0.5, clock=clock)
    assert snapshot.get() == 1
    clock.now += 0.6
    snapshot.get()  # starts a refresh, which stalls
    assert started.wait(10)
    snapshot.clear()
    release.set()
    assert snapshot.get() == 3  # not the refresh begun before the clear


def test_peek_answers_a_young_value_or_none_and_never_computes_itself():
    clock, calls = Clock(), []
    snapshot = Snapshot(lambda: calls.append(1) or len(calls), max_age=1.0, refresh_after=1.0, clock=clock)

    assert snapshot.peek() is None and calls == []
    assert snapshot.get() == 1
    clock.now += 1.0
    assert snapshot.peek() == 1
    clock.now += 0.001
    assert snapshot.peek() is None and calls == [1]  # too old: the caller computes it with get()
    assert snapshot.get() == 2


def test_peek_past_refresh_after_starts_a_refresh():
    clock, done = Clock(), threading.Event()
    snapshot = Snapshot(lambda: clock.now, max_age=1.0, refresh_after=0.5, after_refresh=done.set, clock=clock)
    snapshot.get()
    clock.now += 0.6

    assert snapshot.peek() == 100.0
    assert done.wait(10)
    assert snapshot.peek() == 100.6
