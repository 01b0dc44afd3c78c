"""The lanes of a pool's ready pods, as one dispatcher sees them.

Leasing answers at once — a lane, or None with the reason — and costs the same
with 8 pods or 512: free lanes wait in a deque, one entry per free lane, and a
pod that left the fleet is skipped lazily when its entries come up. A lease may
prefer some pods (those that hold the page's document): they are tried first,
a bounded few, each in constant time; a lane taken that way leaves its deque
entry behind, skipped when it comes up, and a pod never has more entries than lanes.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from itertools import islice

# How many preferred pods one lease looks at, at most: its cost stays flat however many pods
# hold a document.
PREFERRED_LOOKS = 4
# How many free lanes ``lease_where`` looks at, at most (stale entries count).
FREE_LOOKS = 16


@dataclass(eq=False)
class PodLanes:
    pod_id: int
    base_url: str
    lanes: int
    token: str = field(default="", repr=False)  # the pod's bearer token: never in a log line
    inflight: int = 0
    failures: int = 0  # consecutive failed forwards
    active: bool = True
    queued: int = 0  # its entries in the free deque (stale ones included)

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}


@dataclass(frozen=True)
class FleetCounts:
    booting: int = 0
    ready: int = 0
    draining: int = 0


class LaneTable:
    def __init__(self) -> None:
        self.pods: dict[int, PodLanes] = {}
        self._free: deque[PodLanes] = deque()
        self.free = 0
        self.total = 0
        self.counts = FleetCounts()

    def sync(self, ready: list[tuple[int, str, int, str]], counts: FleetCounts) -> None:
        """Make the table match the pool's ready pods: (pod id, base url, lanes this dispatcher may
        use, token)."""
        self.counts = counts
        seen = set()
        added: list[PodLanes] = []
        for pod_id, base_url, lanes, token in ready:
            seen.add(pod_id)
            pod = self.pods.get(pod_id)
            if pod is None:
                pod = PodLanes(pod_id, base_url, lanes, token)
                self.pods[pod_id] = pod
                added.append(pod)
                self.free += lanes
                self.total += lanes
            elif pod.lanes != lanes:
                self._resize(pod, lanes)
        # Interleave new pods' lanes so that consecutive leases spread across pods.
        for lane in range(max((p.lanes for p in added), default=0)):
            for pod in added:
                if lane < pod.lanes:
                    self._push(pod)
        for pod_id in [pid for pid in self.pods if pid not in seen]:
            self.remove(pod_id)

    def _resize(self, pod: PodLanes, lanes: int) -> None:
        # Entries beyond a pod's share are skipped when they come up; new ones are added.
        self.free += max(0, lanes - pod.inflight) - max(0, pod.lanes - pod.inflight)
        self.total += lanes - pod.lanes
        pod.lanes = lanes
        while pod.queued < lanes - pod.inflight:
            self._push(pod)

    def remove(self, pod_id: int) -> None:
        pod = self.pods.pop(pod_id, None)
        if pod is None:
            return
        pod.active = False
        self.free -= max(0, pod.lanes - pod.inflight)
        self.total -= pod.lanes

    def _push(self, pod: PodLanes) -> None:
        pod.queued += 1
        self._free.append(pod)

    def lease(self, prefer: Iterable[int] = (), *, anywhere: bool = True) -> PodLanes | None:
        """A free lane: on one of the ``prefer`` pods (the first few looked at) if one has a lane
        free, else (``anywhere``) on any pod; None when there is none."""
        for looked, pod_id in enumerate(prefer):
            if looked >= PREFERRED_LOOKS:
                break
            pod = self.pods.get(pod_id)
            if pod is not None and pod.active and pod.inflight < pod.lanes:
                return self._take(pod)  # its deque entry stays: skipped, or used, when it comes up
        while anywhere and self._free:
            pod = self._free.popleft()
            pod.queued -= 1
            if pod.active and pod.inflight < pod.lanes:
                return self._take(pod)
        return None

    def lease_where(self, wanted: Callable[[int], bool]) -> PodLanes | None:
        """A free lane on a pod that is ``wanted`` (by its id), among the next FREE_LOOKS free lanes;
        None when none of them is. Where a document's pods are many, the few a lease looks at may
        all be busy while others of them have lanes free: these are found from the free lanes'
        side. The lane's deque entry stays, as a preferred lease leaves it; entries at the front
        that are stale (their pods' lanes taken by preferred leases since, or gone) are dropped
        first, else they would fill the looks."""
        free = self._free
        while free and not (free[0].active and free[0].inflight < free[0].lanes):
            free.popleft().queued -= 1
        for pod in islice(free, FREE_LOOKS):
            if pod.active and pod.inflight < pod.lanes and wanted(pod.pod_id):
                return self._take(pod)
        return None

    def _take(self, pod: PodLanes) -> PodLanes:
        pod.inflight += 1
        self.free -= 1
        return pod

    def release(self, pod: PodLanes) -> None:
        pod.inflight -= 1
        if pod.active and pod.inflight < pod.lanes:
            self.free += 1
            if pod.queued < pod.lanes - pod.inflight:
                self._push(pod)

    def why_none(self) -> str:
        """Why no lane is free right now, for logs and the status page."""
        counts = self.counts
        if not (counts.booting or counts.ready or counts.draining):
            return "no pods"
        if not counts.ready and counts.booting:
            return f"none healthy ({counts.booting} booting)"
        if not counts.ready and counts.draining:
            return f"all draining ({counts.draining})"
        return f"all at their cap ({self.total - self.free}/{self.total} lanes in use)"
