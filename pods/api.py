"""JSON endpoints for the fleet."""

from __future__ import annotations

import asyncio

from asgiref.sync import sync_to_async
from django.http import HttpRequest, JsonResponse
from django.utils import timezone

from fleetadmin.api import ApiError, api_view
from pods import capacity, selectors

FRESH_PRICES_WAIT_SECONDS = 15.0


@api_view(scope="read")
def status(request: HttpRequest) -> JsonResponse:
    return JsonResponse(selectors.fleet_status())


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
        await sync_to_async(_enqueue_fetch)(provider)
    deadline = asyncio.get_running_loop().time() + (FRESH_PRICES_WAIT_SECONDS if fresh else 0)
    while True:
        catalogue = await sync_to_async(capacity.catalogue_cached)(provider)
        fetched = catalogue is not None and catalogue.fetched_at and catalogue.fetched_at >= asked_at
        if not fresh or fetched or asyncio.get_running_loop().time() > deadline:
            break
        await asyncio.sleep(0.2)
    if catalogue is None:
        if not fresh:
            await sync_to_async(_enqueue_fetch)(provider)
        raise ApiError("no price catalogue yet; a worker is fetching it, ask again shortly", 503)
    return JsonResponse(_catalogue_dict(provider, catalogue, refreshing=fresh and not fetched))


def _enqueue_fetch(provider: str) -> None:
    from django_q.tasks import async_task

    async_task("pods.tasks.fetch_catalogue", provider, True, task_name=f"prices {provider}", group="prices")
