"""The lanes of a pool's ready pods, as one dispatcher sees them.

Leasing answers at once — a lane, or None with the reason — and costs the same
with 8 pods or 512: free lanes wait in a deque, one entry per free lane, and a
pod that left the fleet is skipped lazily when its entries come up.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass


@dataclass(eq=False)
class PodLanes:
    pod_id: int
    base_url: str
    lanes: int
    inflight: int = 0
    failures: int = 0  # consecutive failed forwards
    active: bool = True


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

    def sync(self, ready: list[tuple[int, str, int]], counts: FleetCounts) -> None:
        """Make the table match the pool's ready pods: (pod id, base url, lanes this dispatcher may use)."""
        self.counts = counts
        seen = set()
        added: list[PodLanes] = []
        for pod_id, base_url, lanes in ready:
            seen.add(pod_id)
            pod = self.pods.get(pod_id)
            if pod is None:
                pod = PodLanes(pod_id, base_url, lanes)
                self.pods[pod_id] = pod
                added.append(pod)
                self.free += lanes
                self.total += lanes
            elif pod.lanes != lanes:
                self._resize(pod, lanes)
        # Interleave new pods' lanes so that consecutive leases spread across pods.
        for lane in range(max((p.lanes for p in added), default=0)):
            self._free.extend(p for p in added if lane < p.lanes)
        for pod_id in [pid for pid in self.pods if pid not in seen]:
            self.remove(pod_id)

    def _resize(self, pod: PodLanes, lanes: int) -> None:
        # Entries beyond a pod's share are skipped when they come up; new ones are added.
        self.free += max(0, lanes - pod.inflight) - max(0, pod.lanes - pod.inflight)
        self.total += lanes - pod.lanes
        if lanes > pod.lanes:
            self._free.extend([pod] * (lanes - pod.lanes))
        pod.lanes = lanes

    def remove(self, pod_id: int) -> None:
        pod = self.pods.pop(pod_id, None)
        if pod is None:
            return
        pod.active = False
        self.free -= max(0, pod.lanes - pod.inflight)
        self.total -= pod.lanes

    def lease(self) -> PodLanes | None:
        while self._free:
            pod = self._free.popleft()
            if pod.active and pod.inflight < pod.lanes:
                pod.inflight += 1
                self.free -= 1
                return pod
        return None

    def release(self, pod: PodLanes) -> None:
        pod.inflight -= 1
        if pod.active and pod.inflight < pod.lanes:
            self.free += 1
            self._free.append(pod)

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
