"""The API's output shapes for the fleet: what ``/v1/runpod/status``, the scale and release
endpoints, the dashboard and the scale task answer for a pool, a pod, a capacity verdict, an
alert, a scale request. Plain functions of rows already read; the models keep no API shape
(HackSoft: serializers in the API layer). What they answer is the API's contract (docs/api.md):
a change here is a change for every client. A pod's token is never in them."""

from __future__ import annotations

from datetime import datetime

from django.utils import timezone

from pods.models import Alert, CapacityVerdict, Pod, Pool, ScaleRequest


def _when(moment: datetime | None) -> str | None:
    return moment.isoformat() if moment else None


def pool_dict(pool: Pool) -> dict:
    return {
        "key": pool.key,
        "name": pool.name or pool.key,
        "provider": pool.provider,
        "min_pods": pool.min_pods,
        "max_pods": pool.max_pods,
        "lanes_per_pod": pool.lanes_per_pod,
        "autostop_seconds": pool.autostop_seconds,
    }


def pod_dict(pod: Pod) -> dict:
    """The pod as the API shows it: ``data_center`` is where the provider placed it, else the
    candidate's; ``spend``: dollars billed until it ended, or until now."""
    return {
        "id": pod.pk,
        "name": pod.name,
        "pool": pod.pool.key,
        "state": pod.state,
        "reason": pod.reason,
        "provider_id": pod.provider_id,
        "lanes": pod.lanes,
        "gpu_type": pod.gpu_type,
        "data_center": pod.location,
        "cost_per_hr": float(pod.cost_per_hr),
        "spend": float(pod.spend()),
        "created_at": pod.created_at.isoformat(),
        "billed_from": _when(pod.billed_from),
        "ready_at": _when(pod.ready_at),
        "ended_at": _when(pod.ended_at),
        "error": pod.error,
    }


def verdict_dict(verdict: CapacityVerdict, *, now: datetime | None = None) -> dict:
    """What a candidate said last, as of ``now``: blocked and for how many seconds more, a probe
    out on it, known open."""
    now = now or timezone.now()
    remaining = (verdict.blocked_until - now).total_seconds() if verdict.blocked_until else 0
    return {
        "candidate": verdict.key,
        "blocked": remaining > 0,
        "remaining_s": round(max(0.0, remaining), 1),
        "probing": bool(verdict.probing_until and verdict.probing_until > now),
        "open": bool(verdict.open_until and verdict.open_until > now),
        "reason": verdict.reason,
    }


def alert_dict(alert: Alert) -> dict:
    return {
        "pool": alert.pool.key if alert.pool_id else None,
        "kind": alert.kind,
        "message": alert.message,
        "count": alert.count,
        "since": alert.created_at.isoformat(),
        "last": alert.updated_at.isoformat(),
    }


def scale_request_dict(scale_request: ScaleRequest) -> dict:
    return {
        "id": scale_request.pk,
        "pool": scale_request.pool.key,
        "target": scale_request.target,
        "state": scale_request.state,
        "result": scale_request.result,
        "created_at": scale_request.created_at.isoformat(),
        "finished_at": _when(scale_request.finished_at),
    }
