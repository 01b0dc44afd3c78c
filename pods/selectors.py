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
from ocrjobs.selectors import dispatchers_live, pools_pages
from pods import capacity
from pods.models import Alert, Pod, Pool

RATE_WINDOW_SECONDS = 60
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
    pages = pools_pages(list(pool_of), now=now, done_since=since)
    alerts = list(Alert.objects.filter(resolved_at__isnull=True).select_related("pool"))
    dispatchers = dispatchers_live()
    result = []
    for pool in pools:
        pods = [p for p in alive if p.pool_id == pool.pk]
        states = Counter(p.state for p in pods)
        ready_lanes = sum(p.lanes for p in pods if p.state == Pod.State.READY)
        per_hour = sum((p.cost_per_hr for p in pods if p.billed_from), Decimal("0"))
        result.append(
            {
                **pool.to_dict(),
                "pods": {state: states.get(state, 0) for state in Pod.ALIVE_STATES},
                "lanes": {"used": pages[pool.pk]["running"], "total": ready_lanes},
                "backlog": pages[pool.pk]["waiting"],
                "pages_per_s": round(pages[pool.pk]["done"] / RATE_WINDOW_SECONDS, 2),
                "dollars_per_hour": float(per_hour),
                "alerts": [a.to_dict() for a in alerts if a.pool_id == pool.pk],
                "dispatch": {
                    "dispatchers": [f"{host}:{pid}" for pool_id, _, host, pid in dispatchers if pool_id == pool.pk],
                    # Why pages wait with no lane, as the dispatchers last said it (no pods, none healthy, ...).
                    "no_lane_reason": next(
                        (note for pool_id, note, _, _ in dispatchers if pool_id == pool.pk and note), ""
                    ),
                },
                "pod_list": [p.to_dict() for p in pods],
            }
        )
    return {
        "at": now.isoformat(),
        "pools": result,
        "alerts": [a.to_dict() for a in alerts],
        "capacity_verdicts": capacity.verdicts_for_status(),
    }


class FleetStatus(NamedTuple):
    data: dict
    json: bytes  # what the status endpoint answers staff, encoded once per snapshot
    json_without_alerts: bytes  # what it answers everyone else (alerts name other users' jobs)


def _fleet_status_with_json() -> FleetStatus:
    data = fleet_status()
    without_alerts = {
        **data,
        "alerts": [],
        "pools": [{**pool, "alerts": []} for pool in data["pools"]],
    }
    return FleetStatus(
        data,
        json.dumps(data, cls=DjangoJSONEncoder).encode(),
        json.dumps(without_alerts, cls=DjangoJSONEncoder).encode(),
    )


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
