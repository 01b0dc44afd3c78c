"""Requests to set a pool's size: a row that the front stores, a short task starts (the warm floor
set, one tick) and passes advance (the next wave of boots, and the verdict) until the pool is at
its target or cannot get there. Nothing waits in a worker; the API's ``wait_s`` polls the row."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from fleetadmin.errors import Invalid
from pods.enqueue import enqueue_scale
from pods.models import Pod, Pool, ScaleRequest
from pods.services import passes
from pods.services.scaler import TickResult, pool_tick

log = logging.getLogger(__name__)

# A started request is looked at this often: soon enough to start the next wave of boots
# within a few seconds of a pod joining (a boot takes minutes).
LOOK_SECONDS = 2.0


def boot_time_limit() -> timedelta:
    """The longest a boot may take, stage by stage: a wave booted now is done (or failed) by then."""
    return timedelta(
        seconds=settings.POD_CREATE_TIMEOUT_SECONDS
        + settings.POD_RUNNING_TIMEOUT_SECONDS
        + settings.POD_READY_TIMEOUT_SECONDS
    )


def scale_request_create(*, pool: Pool, pods: int | None = None, delta: int | None = None, by: str = ""):
    """Check a request to set the pool's size, store it (superseding the pool's older pending
    ones: two requests never fight over the warm floor) and have a worker start it."""
    if (pods is None) == (delta is None):
        raise Invalid("give exactly one of 'pods' (a number of pods) or 'delta' (a change)")
    if pods is None:
        pods = sum(_pods_of(pool)) + delta
    if pods < 0:
        raise Invalid(f"a pool cannot have {pods} pods", field="pods")
    if pods > pool.max_pods:
        raise Invalid(f"pool {pool.key} allows at most {pool.max_pods} pods; asked for {pods}")
    with transaction.atomic():
        now = timezone.now()
        request = ScaleRequest.objects.create(
            pool=pool, target=pods, requested_by=by[:150], created_at=now, deadline_at=now + boot_time_limit()
        )
        for older in ScaleRequest.objects.filter(pool=pool, state=ScaleRequest.State.PENDING).exclude(pk=request.pk):
            _finish(older, ScaleRequest.State.FAILED, older.result, error=f"superseded by request {request.pk}")
        transaction.on_commit(lambda: enqueue_scale(request.pk, pool_key=pool.key))
        transaction.on_commit(passes.pass_request)
    return request


def scale_request_start(*, request_id: int) -> ScaleRequest:
    """Set the warm floor to the target and tick once, booting or shedding at once (idle or not,
    never a pod with a page running); no waiting: passes take it from there."""
    with transaction.atomic():
        request = ScaleRequest.objects.select_for_update().select_related("pool").get(pk=request_id)
        if request.state != ScaleRequest.State.PENDING or _started(request):
            return request  # superseded, finished, or started already (a task sent twice)
        Pool.objects.filter(pk=request.pool_id).update(min_pods=request.target)
    tick = pool_tick(pool=request.pool, force_shed=True)
    result = _counted({"started_at": timezone.now().isoformat()}, tick)
    ScaleRequest.objects.filter(pk=request.pk, state=ScaleRequest.State.PENDING).update(
        result={**result, **_progress(request.pool)}, deadline_at=_deadline_after(request, tick)
    )
    passes.pass_request()
    request.refresh_from_db()
    return request


def scale_requests_due(*, now: datetime, limit: int) -> list[int]:
    """Pending requests due a look (there are few): a started one every ``LOOK_SECONDS``, one not
    started yet once its deadline has passed (its start asks for a pass when it runs). Not every
    pass: a request pending for minutes would otherwise keep passes running back to back."""
    pending = ScaleRequest.objects.filter(state=ScaleRequest.State.PENDING).order_by("created_at")
    due = []
    for request in pending.only("pk", "result", "created_at", "deadline_at"):
        if _started(request):
            checked = request.result.get("checked_at")
            if checked is None or datetime.fromisoformat(checked) + timedelta(seconds=LOOK_SECONDS) <= now:
                due.append(request.pk)
        elif (request.deadline_at or request.created_at + boot_time_limit()) < now:
            due.append(request.pk)
    return due[:limit]


def scale_request_step(request_id: int) -> None:
    """One look at a pending request: start the next wave of boots if the pool has room for it
    (a target above ``max_parallel_boots`` is reached wave by wave), then decide.

    - done: as many ready pods as the target and none booting;
    - failed: past its deadline (the time limits of its latest wave of boots: a request whose
      start was lost, or whose boots hang, never stays pending), or nothing is booting and it
      cannot get closer (the tick is blocked or boots nothing, as many boots failed as it wanted,
      the pool's work keeps more pods than the target);
    - else it stays pending, its result updated.
    """
    request = ScaleRequest.objects.select_related("pool").filter(pk=request_id).first()
    if request is None or request.state != ScaleRequest.State.PENDING:
        return
    now = timezone.now()
    deadline = request.deadline_at or request.created_at + boot_time_limit()
    if not _started(request):
        if now > deadline:
            _finish(request, ScaleRequest.State.FAILED, request.result, error="its start never ran (the task was lost)")
        return
    pool, target = request.pool, request.target
    ready, booting = _pods_of(pool)
    failed = _boots_failed(request)
    tick = None
    if ready + booting < target and booting < pool.max_parallel_boots and len(failed) < target:
        tick = pool_tick(pool=pool)  # the next wave toward the target
    elif ready > target and not booting:
        tick = pool_tick(pool=pool, force_shed=True)  # pods busy at the start are released once free
    result = {**_counted(request.result, tick), **_progress(pool), "boots_failed": len(failed),
              "checked_at": now.isoformat()}  # fmt: skip
    ready, booting = result["ready"], result["booting"]
    if ready == target and not booting:
        _finish(request, ScaleRequest.State.DONE, result)
        return
    error = ""
    if now > deadline:
        error = f"not at its target by its deadline: {ready} of {target} ready, {booting} booting"
    elif not booting and ready < target:
        if len(failed) >= target:
            error = f"{len(failed)} boots failed, the last: {failed[0]}"
        elif tick is not None and not tick.booted:
            error = f"{ready} of {target} ready and no more can boot: {tick.blocked or 'the pool boots no more'}"
    elif not booting and ready > target and tick is not None and not tick.shed and tick.wanted > target:
        error = f"the pool's work keeps {tick.wanted} pods, more than {target}"
    if error:
        _finish(request, ScaleRequest.State.FAILED, result, error=error)
        return
    updated = {"result": result}
    if tick is not None and tick.booted:
        updated["deadline_at"] = _deadline_after(request, tick)
    ScaleRequest.objects.filter(pk=request.pk, state=ScaleRequest.State.PENDING).update(**updated)


def _started(request: ScaleRequest) -> bool:
    return "started_at" in request.result


def _pods_of(pool: Pool) -> tuple[int, int]:
    """Ready and booting pods of the pool (a boot a shed asked to stop is not counted)."""
    serving = pool.pods.filter(cancel_requested_at=None)
    return serving.filter(state=Pod.State.READY).count(), serving.filter(state=Pod.State.BOOTING).count()


def _progress(pool: Pool) -> dict:
    ready, booting = _pods_of(pool)
    return {"ready": ready, "booting": booting}


def _boots_failed(request: ScaleRequest) -> list[str]:
    """The errors of the pool's boots that failed since the request was made, newest first."""
    failed = request.pool.pods.filter(state=Pod.State.FAILED, created_at__gte=request.created_at)
    return list(failed.order_by("-ended_at").values_list("error", flat=True))


def _counted(result: dict, tick: TickResult | None) -> dict:
    """The result with the tick's boots, releases and stopped boots added to its totals."""
    totals = {key: result.get(key, 0) for key in ("booted", "released", "boots_cancelled")}
    totals["blocked"] = result.get("blocked", "")
    if tick is not None:
        totals["booted"] += len(tick.booted)
        totals["released"] += len(tick.shed)
        totals["boots_cancelled"] += tick.boots_cancelled
        totals["blocked"] = tick.blocked
    return {**result, **totals}


def _deadline_after(request: ScaleRequest, tick: TickResult) -> datetime:
    """A wave booted now has its boots' time limits from now: the request is not failed before."""
    deadline = request.deadline_at or request.created_at + boot_time_limit()
    return max(deadline, timezone.now() + boot_time_limit()) if tick.booted else deadline


def _finish(request: ScaleRequest, state: str, result: dict, *, error: str = "") -> None:
    result = {**result, "error": error} if error else result
    finished = ScaleRequest.objects.filter(pk=request.pk, state=ScaleRequest.State.PENDING).update(
        state=state, result=result, finished_at=timezone.now()
    )
    if finished:
        log.log(logging.WARNING if error else logging.INFO, "scale request %s %s%s", request, state,
                f": {error}" if error else "")  # fmt: skip
