"""What the control plane asks a pod directly (not its provider): whether its engine answers,
what it reports, and the bearer token every request to it carries."""

from __future__ import annotations

import httpx

from fleetadmin.localhost import localhost_transport

MAX_LANES = 256  # a pod reporting more is believed no further than the pool's own figure


def pod_headers(token: str) -> dict[str, str]:
    """What every request to a pod carries: its bearer token (none for a pod booted without one)."""
    return {"Authorization": f"Bearer {token}"} if token else {}


def pod_engine(base_url: str, *, token: str = "", timeout: float = 2.0) -> dict | None:
    """What the pod's /v1/models says once /healthz answers and its engine is ready; else None."""
    return pod_engine_answer(base_url, token=token, timeout=timeout)[1]


def pod_engine_answer(base_url: str, *, token: str = "", timeout: float = 2.0) -> tuple[bool, dict | None]:
    """Whether the pod server answered at all (it then knows the control plane is there: its
    autostop counts from now), and ``pod_engine``'s answer."""
    answered = False
    try:
        # Names under .localhost (RFC 6761) on loopback, as the dispatcher's session has them.
        with httpx.Client(timeout=timeout, headers=pod_headers(token), transport=localhost_transport()) as client:
            health = client.get(f"{base_url}/healthz")
            answered = health.status_code < 500 or _from_the_pod_server(health)
            if health.status_code != 200:
                return answered, None
            models = client.get(f"{base_url}/v1/models").json()
    except (httpx.HTTPError, ValueError):
        return answered, None
    return answered, models if isinstance(models, dict) and models.get("ready") else None


def _from_the_pod_server(response: httpx.Response) -> bool:
    # A loading pod server answers 503 {"status": "loading"}; a proxy in front of a stopped pod
    # answers 502 (or 503) with anything else.
    try:
        return isinstance(body := response.json(), dict) and "status" in body
    except ValueError:
        return False


def pod_keepalive(base_url: str, *, token: str = "", timeout: float = 5.0) -> bool:
    """Speak to the pod so that it does not stop itself (its autostop counts requests carrying its
    token): True if the pod server answered, whatever its health (not a proxy in front of it)."""
    try:
        with httpx.Client(timeout=timeout, headers=pod_headers(token), transport=localhost_transport()) as client:
            health = client.get(f"{base_url}/healthz")
    except httpx.HTTPError:
        return False
    return health.status_code < 500 or _from_the_pod_server(health)


def reported_lanes(engine: dict, *, default: int) -> int:
    """The lanes a pod says it serves (its GPU type and engine decide), else the pool's."""
    lanes = engine.get("lanes")
    return lanes if type(lanes) is int and 1 <= lanes <= MAX_LANES else default


def pod_is_serving(base_url: str, *, token: str = "", timeout: float = 2.0) -> bool:
    return pod_engine(base_url, token=token, timeout=timeout) is not None
