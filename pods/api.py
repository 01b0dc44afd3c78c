"""JSON endpoints for the fleet."""

from __future__ import annotations

import asyncio
from datetime import UTC

from asgiref.sync import sync_to_async
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from pydantic import BaseModel, ConfigDict, Field

from fleetadmin.api import ApiError, api_view, parse_json
from pods import capacity, enqueue, hooks, selectors
from pods.audit import Actor
from pods.models import AuditEntry, Pod, Pool, ScaleRequest
from pods.serializers import pod_dict, scale_request_dict
from pods.services import lifecycle, scale_requests
from pods.spend import spend_report

FRESH_PRICES_WAIT_SECONDS = 15.0


def _sees_everyone(request: HttpRequest) -> bool:
    return request.api_user.is_staff or "admin" in request.api_scopes


@api_view(scope="read")
async def status(request: HttpRequest) -> HttpResponse:
    """The fleet as of at most ``selectors.STATUS_MAX_AGE_SECONDS`` ago (one snapshot per process).

    While the snapshot is young it is answered from the loop, with the JSON encoded once per
    snapshot, and refreshed ahead on the snapshot's own thread. Only when there is no young one
    does the request wait, on its thread, for the one computation in progress (or make it).
    Alerts (which name jobs and their deadlines) are for staff and admin tokens, as on the
    dashboard.
    """
    snapshot = selectors.fleet_status_snapshot.peek()
    if snapshot is None:
        snapshot = await sync_to_async(selectors.fleet_status_snapshot.get)()
    if _sees_everyone(request):
        body = snapshot.json
    elif snapshot.grouped:  # the caller's groups choose the pools kept to groups (one query)
        groups = frozenset([pk async for pk in request.api_user.groups.values_list("pk", flat=True)])
        body = snapshot.json_for(groups)
    else:
        body = snapshot.json_for()
    return HttpResponse(body, content_type="application/json")


def _catalogue_dict(provider: str, catalogue: capacity.Catalogue, *, refreshing: bool = False) -> dict:
    return {
        "provider": provider,
        "fetched_at": catalogue.fetched_at.isoformat() if catalogue.fetched_at else None,
        "stale": catalogue.stale,
        "refreshing": refreshing,
        "error": catalogue.error,
        "offers": [
            {"gpu_type": o.gpu_type, "cloud_type": o.cloud_type, "cost_per_hr": float(o.cost_per_hr)}
            for o in catalogue.offers
        ],
    }


@api_view(scope="read")
async def prices(request: HttpRequest) -> JsonResponse:
    """The price catalogue as cached; ``?fresh=1`` asks a worker to fetch it now and waits for it
    on the event loop (the front never calls the provider itself)."""
    provider = request.GET.get("provider", "runpod")
    if provider not in ("runpod", "local"):
        raise ApiError(f"unknown provider {provider!r}", 404)
    fresh = request.GET.get("fresh", "") in ("1", "true")
    asked_at = timezone.now()
    if fresh:
        current = await sync_to_async(capacity.catalogue_cached)(provider)
        if (
            current is not None
            and current.fetched_at
            and (asked_at - current.fetched_at).total_seconds() < (capacity.CATALOGUE_FRESH_SECONDS)
        ):
            return JsonResponse(_catalogue_dict(provider, current))  # fresh enough: no call on the provider
        await sync_to_async(enqueue.enqueue_fetch_catalogue)(provider)
    deadline = asyncio.get_running_loop().time() + (FRESH_PRICES_WAIT_SECONDS if fresh else 0)
    while True:
        catalogue = await sync_to_async(capacity.catalogue_cached)(provider)
        fetched = catalogue is not None and catalogue.fetched_at and catalogue.fetched_at >= asked_at
        if not fresh or fetched or asyncio.get_running_loop().time() > deadline:
            break
        await asyncio.sleep(0.2)
    if catalogue is None:
        if not fresh:
            await sync_to_async(enqueue.enqueue_fetch_catalogue)(provider)
        raise ApiError("no price catalogue yet; a worker is fetching it, ask again shortly", 503)
    return JsonResponse(_catalogue_dict(provider, catalogue, refreshing=fresh and not fetched))


class ScaleBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    pool: str = Field(min_length=1, max_length=40)
    pods: int | None = Field(default=None, ge=0, le=10_000)
    delta: int | None = Field(default=None, ge=-10_000, le=10_000)
    wait_s: float = Field(default=20.0, ge=0, le=300)


class ReleaseBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    pod_id: int = Field(ge=1)
    reason: str = Field(default="released by API", max_length=200)


@api_view(scope="admin", methods=("POST",))
async def scale(request: HttpRequest) -> JsonResponse:
    """Set a pool's size: the result within ``wait_s``, else 202 ``pending`` with the request id."""
    body = parse_json(request, ScaleBody)
    pool = await Pool.objects.filter(key=body.pool).afirst()
    if pool is None:
        raise ApiError(f"unknown pool {body.pool!r}", 404)
    scale_request = await sync_to_async(scale_requests.scale_request_create)(
        pool=pool, pods=body.pods, delta=body.delta, by=str(request.api_user)
    )  # (an Invalid size: 400, fleetadmin.api.STATUS_FOR)
    deadline = asyncio.get_running_loop().time() + body.wait_s
    while scale_request.state == ScaleRequest.State.PENDING and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.2)
        scale_request = await ScaleRequest.objects.select_related("pool").aget(pk=scale_request.pk)
    status = 202 if scale_request.state == ScaleRequest.State.PENDING else 200
    shown = {**scale_request_dict(scale_request), "url": f"/v1/runpod/scale/{scale_request.pk}"}
    return JsonResponse(shown, status=status)


@api_view(scope="read")
def scale_detail(request: HttpRequest, request_id: int) -> JsonResponse:
    scale_request = ScaleRequest.objects.select_related("pool").filter(pk=request_id).first()
    # Scaling is asked with an admin token: nobody else's to follow (its result carries the boots'
    # errors, and its pool may be staff-only; review N10).
    if scale_request is None or not _sees_everyone(request):
        raise ApiError(f"no scale request {request_id}", 404)
    return JsonResponse(scale_request_dict(scale_request))


@api_view(scope="admin", methods=("POST",))
def release(request: HttpRequest) -> JsonResponse:
    """End a pod: its spend is attributed now, a pass terminates it at the provider. Idempotent."""
    body = parse_json(request, ReleaseBody)
    pod = Pod.objects.select_related("pool").filter(pk=body.pod_id).first()
    if pod is None:
        raise ApiError(f"no pod {body.pod_id}", 404)
    released = lifecycle.pod_release(pod=pod, reason=body.reason, actor=Actor(request.api_user, AuditEntry.Door.API))
    pod.refresh_from_db()
    return JsonResponse({"released": released, "already_ended": not released, "pod": pod_dict(pod)})


@api_view(scope="read")
def spend(request: HttpRequest) -> JsonResponse:
    since_text = request.GET.get("since")
    since = None
    if since_text:
        since = parse_datetime(since_text)
        if since is None:
            raise ApiError("since must be an ISO 8601 time, e.g. 2026-11-29T00:00:00Z", 400)
        if timezone.is_naive(since):
            since = timezone.make_aware(since, UTC)
    report = spend_report(since=since)
    if not _sees_everyone(request):  # (non-staff callers see only their own jobs)
        billed = [int(job) for job in report["by_job"]]
        own = (
            hooks.jobs()
            .jobs_visible_to(request.api_user, request.api_scopes)
            .filter(pk__in=billed)
            .values_list("pk", flat=True)
        )
        own = {str(pk) for pk in own}
        report["by_job"] = {job: dollars for job, dollars in report["by_job"].items() if job in own}
        # Nor the pools not open to them, by name or by their pods' (review N10); the totals stay the fleet's.
        closed = Pool.objects.exclude(pk__in=Pool.objects.open_to(request.api_user).values("pk"))
        closed_pods = set(Pod.objects.filter(pool__in=closed).values_list("name", flat=True))
        closed_keys = set(closed.values_list("key", flat=True))
        report["by_pool"] = {key: dollars for key, dollars in report["by_pool"].items() if key not in closed_keys}
        report["by_pod"] = {name: dollars for name, dollars in report["by_pod"].items() if name not in closed_pods}
    return JsonResponse(report)


@api_view(scope="read")
def models(request: HttpRequest) -> JsonResponse:
    """The engines the ready pods reported when they joined, by pool (no pod is asked now)."""
    pools = []
    # The pools open to the caller (review N10: staff-only pools are not everyone's to see).
    shown = Pool.objects.all() if _sees_everyone(request) else Pool.objects.open_to(request.api_user)
    for pool in shown:
        engines = {}
        for pod in pool.pods.ready():
            engine = pod.engine or {}
            key = (engine.get("engine"), engine.get("version"))
            entry = engines.setdefault(key, {"engine": key[0], "version": key[1], "languages": engine.get("languages", []),
                                             "pods": 0, "lanes": 0})  # fmt: skip
            entry["pods"] += 1
            entry["lanes"] += pod.lanes
        pools.append({"pool": pool.key, "provider": pool.provider, "models": list(engines.values())})
    return JsonResponse({"pools": pools})
