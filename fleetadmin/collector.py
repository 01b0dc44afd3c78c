"""The garbage collector kept out of a busy event loop's way, through its public hooks (``gc``).

A dispatcher's loop keeps thousands of requests in flight for seconds each. Their objects outlive
the collector's youngest generation and are promoted, and the full collections that follow walk
every object the process holds, Django's and the imports' included, while the loop waits. At 256
pods x 8 lanes (bench/dispatch.py, PostgreSQL, 40,960 pages) the collector took 8.9 of the
dispatcher's 16 CPU-seconds, and one full collection held the loop for 308 ms: pages' answers
waited in the socket meanwhile.

``quiet_collector()`` wraps such a loop's run: the objects alive at its start (the process's own,
long-lived) are left out of every collection (``gc.freeze``), and the youngest generation is
collected after GEN0_THRESHOLD allocations instead of Python's 700. Objects that die young are
freed by their counts anyway; what waits longer is cyclic garbage, at most that many objects. Both
are undone at its end: a worker process runs other tasks afterwards. The same run: the collector
0.65 CPU-seconds, its longest pause 92 ms, the dispatcher's CPU 10.0 seconds.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

GEN0_THRESHOLD = 50_000


@contextlib.contextmanager
def quiet_collector(gen0: int = GEN0_THRESHOLD) -> Iterator[None]:
    thresholds = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(gen0, *thresholds[1:])
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
        gc.unfreeze()
