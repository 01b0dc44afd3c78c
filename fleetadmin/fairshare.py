"""Slots shared by every user (URL fetches, webhook deliveries, searchable PDF builds), taken in
turn by owner (invariant 19, review N6): a pure decision on a snapshot, the same for each kind.

The snapshot is what holds a slot now (its owner and the host it talks to) and what waits, each
owner's oldest first. The next slot goes to the owner holding the fewest (ties: the one served
longest ago, then the one whose oldest wait is oldest), to their oldest item whose host is under its cap; an owner at their cap
waits. So one owner's thousand slow URLs hold ``per_owner`` slots at most, and another owner's
one URL takes a free slot at once instead of waiting behind them.
"""

from __future__ import annotations

import math
import urllib.parse
from collections import Counter
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass

# Owners a decision looks at, those waiting longest first: a bound on its queries (one per owner)
# however many users wait; the slots are a handful, so a later owner's turn comes at the next.
OWNERS_CONSIDERED = 50


@dataclass(frozen=True)
class Waiting:
    id: int
    owner: Hashable
    host: str = ""


@dataclass(frozen=True)
class Held:
    owner: Hashable
    host: str = ""


def host_of(url: str) -> str:
    """The host a URL talks to (its port apart), lower case; empty when it has none."""
    try:
        return (urllib.parse.urlsplit(url).hostname or "").lower()
    except ValueError:
        return ""


def take_turns(*, held: Iterable[Held], waiting: Sequence[Waiting], slots: int, per_owner: int,
               per_host: int | None = None, served: Mapping[Hashable, float] | None = None) -> list[int]:  # fmt: skip
    """The ids of ``waiting`` (oldest first) that may start now, in the order they take the free
    slots: at most ``slots`` held in all, ``per_owner`` by one owner, ``per_host`` (None: no cap)
    on one host (an empty host is never capped). Among owners holding as many, the one
    ``served`` longest ago (a timestamp; never: first) goes first, then the longest waiting."""
    served = dict(served or {})
    held = list(held)
    owners, hosts = Counter(h.owner for h in held), Counter(h.host for h in held if h.host)
    free = slots - len(held)
    queues: dict[Hashable, list[Waiting]] = {}
    for item in waiting:  # each owner's queue, owners in the order of their oldest wait
        queues.setdefault(item.owner, []).append(item)
    order = {owner: index for index, owner in enumerate(queues)}

    def turn(owner: Hashable) -> tuple:
        return owners[owner], served.get(owner, -math.inf), order[owner]

    chosen: list[int] = []
    while free > 0:
        best = None
        for owner, queue in queues.items():
            if owners[owner] >= per_owner:
                continue
            item = next((i for i in queue if not i.host or per_host is None or hosts[i.host] < per_host), None)
            if item is not None and (best is None or turn(owner) < turn(best.owner)):
                best = item
        if best is None:
            break
        queues[best.owner].remove(best)
        owners[best.owner] += 1
        served[best.owner] = math.inf
        if best.host:
            hosts[best.host] += 1
        chosen.append(best.id)
        free -= 1
    return chosen
