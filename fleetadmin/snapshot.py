"""A per-process snapshot: a read computed at most once per ``max_age`` seconds, whoever asks.

The status endpoint and the dashboard read the whole fleet (tens of thousands of
pages counted); computing that for every request is what stalled the front.
A ``Snapshot`` answers from its last value while it is at most ``max_age`` old.

- Older than that (or none yet): one caller computes a new value while every
  other caller waits for it and takes it, so that concurrent callers never
  compute it twice.
- Older than ``refresh_after`` but still young enough: the caller gets it at
  once, and a new value is computed on the snapshot's own thread. Under steady
  traffic nobody waits for a computation, and no value served is older than
  ``max_age``.

Thread-safe. An async caller takes ``peek()`` on its loop (it never waits: the
value, or None when there is no young one) and runs ``get()`` on a thread only
when it got None. The age of a value counts from the start of its computation:
a value is never served as fresher than the database it was read from.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Generic, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")


class Snapshot(Generic[T]):
    def __init__(
        self,
        compute: Callable[[], T],
        *,
        max_age: float,
        refresh_after: float | None = None,
        after_refresh: Callable[[], None] | None = None,
        name: str = "snapshot",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``refresh_after`` defaults to half of ``max_age``; ``after_refresh`` runs on the snapshot's
        thread after each computation there (to close its database connection)."""
        if max_age < 0:
            raise ValueError("max_age must not be negative")
        self.compute = compute
        self.max_age = max_age
        self.refresh_after = max_age / 2 if refresh_after is None else min(refresh_after, max_age)
        self.after_refresh = after_refresh
        self.name = name
        self.clock = clock
        self.computations = 0
        self._lock = threading.Lock()  # held by the one caller computing
        self._state = threading.Lock()  # guards _refreshing and _generation
        self._taken: tuple[float, T] | None = None  # (when its computation started, the value)
        self._refreshing = False
        self._generation = 0
        self._executor: ThreadPoolExecutor | None = None

    def get(self) -> T:
        """The last value if at most ``max_age`` old, else a new one (computed once for all waiting)."""
        young, value = self._young()
        if young:
            return value
        with self._lock:
            # Whoever held the lock before us, or the snapshot's thread, may have just computed it.
            taken = self._taken
            if taken is not None and self.clock() - taken[0] <= self.max_age:
                return taken[1]
            return self._compute_and_keep()

    def peek(self) -> T | None:
        """The value if at most ``max_age`` old, else None; never waits (an async caller may use it on
        its loop, and ``get()`` on a thread when it gets None). Refreshes ahead like ``get()``."""
        return self._young()[1]

    def clear(self) -> None:
        """Forget the value, and any computation in progress: the next ``get()`` computes (tests)."""
        with self._state:
            self._generation += 1
            self._taken = None

    def _young(self) -> tuple[bool, T | None]:
        """(True, the value) if it is at most ``max_age`` old, starting a refresh past ``refresh_after``."""
        taken = self._taken
        if taken is None:
            return False, None
        age = self.clock() - taken[0]
        if age > self.max_age:
            return False, None
        if age > self.refresh_after:
            self._refresh_in_background()
        return True, taken[1]

    def _compute_and_keep(self) -> T:
        generation = self._generation
        started = self.clock()
        value = self.compute()
        with self._state:
            self.computations += 1
            if generation == self._generation:
                self._taken = (started, value)
        return value

    def _refresh_in_background(self) -> None:
        with self._state:
            if self._refreshing:
                return
            self._refreshing = True
            if self._executor is None:
                self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=self.name)
        self._executor.submit(self._refresh)

    def _refresh(self) -> None:
        try:
            with self._lock:
                taken = self._taken
                if taken is None or self.clock() - taken[0] > self.refresh_after:
                    self._compute_and_keep()
        except Exception:
            log.exception("%s: refresh failed; the next caller past max_age computes it", self.name)
        finally:
            with self._state:
                self._refreshing = False
            if self.after_refresh is not None:
                self.after_refresh()
