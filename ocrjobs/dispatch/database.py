"""The dispatcher's database calls: each runs on the loop's own database thread
(``DispatchLoop.db``), never on the event loop. Each is safe to repeat after an error.
"""

from __future__ import annotations

from django.db import close_old_connections, connection
from django.utils import timezone

from ocrjobs.dispatch.lanes import FleetCounts
from ocrjobs.models import Dispatcher
from ocrjobs.services.pages import PageResult, claims_renew, pages_assign_pods, pages_complete
from pods import enqueue
from pods.models import Pod
from pods.services.lifecycle import pods_mark_busy


def close_connection() -> None:
    connection.close()  # the database thread's own connection


def fleet(*, pool_id: int) -> tuple[list[tuple[int, str, int, str]], FleetCounts]:
    """The pool's ready pods with the share of their lanes this dispatcher may use (dispatchers of
    one pool split every pod's lanes between them) and their tokens."""
    close_old_connections()
    pods = Pod.objects.alive().filter(pool_id=pool_id).reachable_here()  # another host's local pods: not from here
    pods = list(pods.values_list("pk", "state", "base_url", "lanes", "token"))
    sharing = max(1, Dispatcher.objects.live().filter(pool_id=pool_id).count())
    ready = [
        (pk, url, max(1, lanes // sharing), token) for pk, state, url, lanes, token in pods if state == Pod.State.READY
    ]
    counts = FleetCounts(
        booting=sum(1 for p in pods if p[1] == Pod.State.BOOTING),
        ready=len(ready),
        draining=sum(1 for p in pods if p[1] == Pod.State.DRAINING),
    )
    return ready, counts


def beat(
    *,
    dispatcher_id: int,
    token: str,
    page_ids: list[int],
    renew_within: float,
    busy_pods: list[int],
    note: str,
    done: int,
    failed: int,
) -> set[int]:
    """The dispatcher's heartbeat: alive, its counts, the claims on its pages in hand that expire
    within ``renew_within`` seconds renewed (the ids it still holds are returned), its busy pods
    marked."""
    now = timezone.now()
    Dispatcher.objects.filter(pk=dispatcher_id).update(heartbeat_at=now, note=note[:200], pages_done=done,
                                                       pages_failed=failed)  # fmt: skip
    held = claims_renew(token=token, page_ids=page_ids, within=renew_within)
    pods_mark_busy(pod_ids=busy_pods, at=now)
    return held


def store(*, token: str, assignments: list[tuple[int, int, int]], results: list[PageResult]) -> set[int]:
    """A flush: where pages went, then the results (the ids stored). Safe to repeat, as each is."""
    if assignments:
        pages_assign_pods(token=token, assignments=assignments)
    return pages_complete(token=token, items=results) if results else set()


def nudge_scaler(*, pool_id: int) -> None:
    enqueue.nudge_scaler(pool_id)


def save_counts(*, dispatcher_id: int, done: int, failed: int) -> None:
    Dispatcher.objects.filter(pk=dispatcher_id).update(pages_done=done, pages_failed=failed)


def revive(*, dispatcher_id: int) -> None:
    Dispatcher.objects.filter(pk=dispatcher_id).update(ended_at=None, heartbeat_at=timezone.now())
