"""Reads of the fleet shaped for the status endpoint and the dashboard."""

from __future__ import annotations

import json
from collections import Counter
from decimal import Decimal
from typing import NamedTuple

from django.core.serializers.json import DjangoJSONEncoder
from django.db import connections
from django.utils import timezone

from fleetadmin.snapshot import Snapshot
from pods import capacity, hooks
from pods.models import Alert, Pod, Pool
from pods.serializers import alert_dict, pod_dict, pool_dict, verdict_dict

RATE_WINDOW_SECONDS = 60
# The pods whose pages are being read: what the dashboard counts as lanes busy and pages running.
SERVING = (Pod.State.READY, Pod.State.DRAINING)
# Invariant 1: the status endpoint and the dashboard answer from a snapshot at most this old,
# so that their cost does not grow with the requests (one or two computations a second per process).
STATUS_MAX_AGE_SECONDS = 1.0


def fleet_status() -> dict:
    """Every pool with its pods, lanes, backlog, rate, cost, alerts; and the capacity verdicts.

    A fixed handful of queries whatever the size of the fleet.
    """
    now = timezone.now()
    since = now - timezone.timedelta(seconds=RATE_WINDOW_SECONDS)
    pools = list(Pool.objects.all())
    pool_of = {pool.pk: pool for pool in pools}
    # (a pod of a pool made since the line above is in the next snapshot)
    alive = [pod for pod in Pod.objects.alive() if pod.pool_id in pool_of]
    for pod in alive:
        pod.pool = pool_of[pod.pool_id]  # the pools just read, not one more instance per pod
    pages = hooks.jobs().pools_pages(list(pool_of), now=now, done_since=since)
    at_pods = hooks.jobs().pages_at_pods(now=now)
    alerts = list(Alert.objects.filter(resolved_at__isnull=True).select_related("pool"))
    dispatchers = hooks.jobs().dispatchers_live()
    result = []
    for pool in pools:
        pods = [p for p in alive if p.pool_id == pool.pk]
        states = Counter(p.state for p in pods)
        # A lane is busy while a page is out at its pod. Pages a dispatcher claimed and holds for
        # the next free lane (one a lane: ocrjobs/dispatch/loop.py) are "claimed", not busy: counted
        # as busy they showed 16 busy of 8 lanes (issue 42). A draining pod's lanes still reading
        # count, busy, until its pages are done; its free ones are no longer offered.
        busy = {p.pk: min(at_pods.get(p.pk, 0), p.lanes) for p in pods if p.state in SERVING}
        ready_lanes = sum(p.lanes if p.state == Pod.State.READY else busy.get(p.pk, 0) for p in pods)
        per_hour = sum((p.cost_per_hr for p in pods if p.billed_from), Decimal("0"))
        result.append(
            {
                **pool_dict(pool),
                "pods": {state: states.get(state, 0) for state in Pod.ALIVE_STATES},
                "lanes": {"used": sum(busy.values()), "total": ready_lanes, "claimed": pages[pool.pk]["running"]},
                "backlog": pages[pool.pk]["waiting"],
                "pages_per_s": round(pages[pool.pk]["done"] / RATE_WINDOW_SECONDS, 2),
                "dollars_per_hour": float(per_hour),
                "alerts": [alert_dict(a) for a in alerts if a.pool_id == pool.pk],
                "dispatch": {
                    "dispatchers": [f"{host}:{pid}" for pool_id, _, host, pid in dispatchers if pool_id == pool.pk],
                    # Why pages wait with no lane, as the dispatchers last said it (no pods, none healthy, ...).
                    "no_lane_reason": next(
                        (note for pool_id, note, _, _ in dispatchers if pool_id == pool.pk and note), ""
                    ),
                },
                "pod_list": [{**pod_dict(p), "busy": busy.get(p.pk, 0)} for p in pods],
            }
        )
    return {
        "at": now.isoformat(),
        "pools": result,
        "alerts": [alert_dict(a) for a in alerts],
        "capacity_verdicts": [verdict_dict(row, now=now) for row in capacity.verdicts_in_force(now=now)],
    }


# What a caller who is neither staff nor holds an admin token is not shown (review N10): a pod's
# provider id (at RunPod, its proxy address, whose /healthz answers anyone), its error and why it
# ended (a provider's or a pod's words), the alerts (they name other users' jobs), and the pools
# not open to them (staff-only pools, pools kept to groups they are not in).
PRIVATE_POD_FIELDS = ("provider_id", "error", "reason")


class PoolAudience(NamedTuple):
    staff_only: bool
    groups: frozenset[int]

    def open_to(self, groups: frozenset[int]) -> bool:
        """As ``Pool.objects.open_to`` decides for a user who is not staff, in ``groups``."""
        return not self.staff_only and (not self.groups or bool(self.groups & groups))


class FleetStatus(NamedTuple):
    data: dict
    json: bytes  # what the status endpoint answers staff, encoded once per snapshot
    public: dict  # what everyone else may see of it, before the pools are chosen for them
    audiences: dict[str, PoolAudience]  # by pool key
    public_json: dict[frozenset[str], bytes]  # encoded once per set of pools shown, as asked

    @property
    def grouped(self) -> bool:
        """Whether a pool is kept to groups: then a caller's own groups decide what they see."""
        return any(audience.groups for audience in self.audiences.values())

    def json_for(self, groups: frozenset[int] = frozenset()) -> bytes:
        """The status as a caller who is not staff, in ``groups``, may see it."""
        shown = frozenset(key for key, audience in self.audiences.items() if audience.open_to(groups))
        if shown not in self.public_json:
            pools = [pool for pool in self.public["pools"] if pool["key"] in shown]
            self.public_json[shown] = json.dumps({**self.public, "pools": pools}, cls=DjangoJSONEncoder).encode()
        return self.public_json[shown]


def _public(data: dict) -> dict:
    def pod(entry: dict) -> dict:
        return {key: value for key, value in entry.items() if key not in PRIVATE_POD_FIELDS}

    pools = [{**pool, "alerts": [], "pod_list": [pod(entry) for entry in pool["pod_list"]]} for pool in data["pools"]]
    return {**data, "alerts": [], "pools": pools}


def _fleet_status_with_json() -> FleetStatus:
    data = fleet_status()
    groups: dict[int, set[int]] = {}
    for pool_id, group_id in Pool.groups.through.objects.values_list("pool_id", "group_id"):
        groups.setdefault(pool_id, set()).add(group_id)
    audiences = {
        key: PoolAudience(staff_only, frozenset(groups.get(pk, ())))
        for pk, key, staff_only in Pool.objects.values_list("pk", "key", "staff_only")
    }
    return FleetStatus(data, json.dumps(data, cls=DjangoJSONEncoder).encode(), _public(data), audiences, {})


# Refreshed ahead on its own thread once 0.75 s old (a refresh under load takes up to a quarter of
# a second), which gives its connection back after each refresh (to the front's pool on PostgreSQL).
fleet_status_snapshot: Snapshot[FleetStatus] = Snapshot(
    _fleet_status_with_json,
    max_age=STATUS_MAX_AGE_SECONDS,
    refresh_after=0.75 * STATUS_MAX_AGE_SECONDS,
    after_refresh=connections.close_all,
    name="fleet-status",
)


def fleet_status_cached() -> dict:
    """``fleet_status()`` at most ``STATUS_MAX_AGE_SECONDS`` old, computed once for concurrent callers
    in this process. Shared by every caller: read it, never change it."""
    return fleet_status_snapshot.get().data
