"""RunPod's APIs as they really answer: one GraphQL call and one REST create of ours, and the
table that sorts every answer into the provider errors.

Why not the SDK's ``run_graphql_query``: it keeps only ``errors[0].message`` and drops
``extensions.code`` (``SUPPLY_CONSTRAINT``, ``INSUFFICIENT_BALANCE``, ...), reads a 429 as JSON
or as garbage, and ignores ``Retry-After`` (review runpod-fidelity-8630753, rows 2 and 13).
The query texts stay the SDK's shapes (pods/providers/runpod.py); only the sending is ours.

Every call has a total deadline (connect, send, every chunk of the answer) and a size cap on
the answer. A call sorts its own failure and raises it; it never retries (the provider does,
with back-off, pods/providers/runpod.py ``_call``).

The classification is a table, read top to bottom, the code first and then the wording
(lower-cased), because RunPod's wordings overlap: the spot capacity answer "There are no
instances available ... Please try again later." ends like a transient fault.
"""

from __future__ import annotations

import email.utils
import json
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from pods.providers.base import (
    AuthFailed,
    BadRequest,
    Balance,
    NoCapacity,
    ProviderError,
    Transient,
    UnknownOffer,
)

DEFAULT_GRAPHQL_BASE = "https://api.runpod.io"
DEFAULT_REST_BASE = "https://rest.runpod.io/v1"
MAX_ANSWER_BYTES = 8 * 1024 * 1024  # the whole pod list of a large account is ~1 MB
CALL_SECONDS = 30.0  # one call, all its phases (the SDK's own timeout per request)
CONNECT_SECONDS = 10.0
MAX_RETRY_AFTER_SECONDS = 300.0  # a Retry-After beyond this is read as this


class PodGone(ProviderError):
    """RunPod says the pod does not exist (get: None, terminate: already done)."""


class UnknownOperation(BadRequest):
    """RunPod's GraphQL no longer knows the mutation (``podRentInterruptable`` is being removed)."""


# (extensions.code, error) — RunPod's codes, as third-party clients and runpodctl report them.
ERROR_CODES: dict[str, type[ProviderError]] = {
    "SUPPLY_CONSTRAINT": NoCapacity,
    "INSUFFICIENT_BALANCE": Balance,
    "SPENDING_LIMIT_EXCEEDED": Balance,
    "POD_NOT_FOUND": PodGone,
    "UNAUTHENTICATED": AuthFailed,
    "FORBIDDEN": AuthFailed,
    "RATE_LIMITED": Transient,
    "TOO_MANY_REQUESTS": Transient,
    "INTERNAL_SERVER_ERROR": Transient,
    "SERVICE_UNAVAILABLE": Transient,
    "GRAPHQL_PARSE_FAILED": BadRequest,
    "GRAPHQL_VALIDATION_FAILED": BadRequest,
    "BAD_USER_INPUT": BadRequest,
}

# (phrase in the lower-cased message, error), first match wins. Every row has a test
# (tests/pods/test_runpod_errors.py) with the wording RunPod was seen to send.
WORDINGS: tuple[tuple[str, type[ProviderError]], ...] = (
    # Capacity: GraphQL on-demand, GraphQL spot ("request specifications"), REST v2, on resume.
    ("no longer any instances available", NoCapacity),
    ("no instances available", NoCapacity),
    ("not enough free gpus", NoCapacity),
    ("no available machines", NoCapacity),
    ("no gpus available", NoCapacity),
    ("minimum bid", NoCapacity),  # outbid since the catalogue was read: as no capacity, for a while
    # Money: the account's balance or its spending limit refuses the pod.
    ("insufficient balance", Balance),
    ("balance is too low", Balance),
    ("not enough balance", Balance),
    ("spending limit", Balance),
    # The offer: a GPU type or data centre RunPod does not know.
    ("unknown gpu type", UnknownOffer),
    ("no gpu found", UnknownOffer),
    ("gpu type not found", UnknownOffer),
    ("data center not found", UnknownOffer),
    # The mutation itself is gone (GraphQL's validation wording for an unknown root field).
    ('cannot query field "podrentinterruptable"', UnknownOperation),
    # Transient faults of RunPod's side.
    ("something went wrong", Transient),
    ("internal server error", Transient),
    ("timed out", Transient),
    ("temporarily unavailable", Transient),
    ("too many requests", Transient),
    ("rate limit", Transient),
    ("please try again later", Transient),
    # The pod.
    ("pod not found", PodGone),
    ("not found", PodGone),
    # The key.
    ("unauthorized", AuthFailed),
    ("api key", AuthFailed),
    ("forbidden", AuthFailed),
    ("permission", AuthFailed),
)


def classify_error(message: str, code: str | None = None) -> ProviderError:
    """The provider error for one RunPod error (its message and ``extensions.code``); anything the
    table does not know is a BadRequest: this request, as it stands, gives no pod."""
    error_class = ERROR_CODES.get((code or "").upper())
    if error_class in (None, BadRequest):
        # A generic code (GRAPHQL_VALIDATION_FAILED) says less than the wording may: an unknown
        # mutation is refused with that code, and must be told from other bad requests.
        lowered = message.lower()
        error_class = next((cls for phrase, cls in WORDINGS if phrase in lowered), BadRequest)
    text = f"{message} ({code})" if code else message
    if error_class is BadRequest:
        text = f"RunPod refused the request: {text}"
    return error_class(text)


def retry_after(value: str | None, *, now: float | None = None) -> float | None:
    """Seconds a ``Retry-After`` header asks us to wait (delta-seconds or an HTTP date), capped."""
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            moment = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        if moment is None:
            return None
        seconds = moment.timestamp() - (time.time() if now is None else now)
    if seconds != seconds:  # NaN
        return None
    return min(max(0.0, seconds), MAX_RETRY_AFTER_SECONDS)


@dataclass(frozen=True)
class Answer:
    status: int
    headers: Mapping[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


def graphql_base() -> str:
    # Read on every call, as the SDK reads it: the simulator is pointed at this way.
    return os.environ.get("RUNPOD_API_BASE_URL", DEFAULT_GRAPHQL_BASE).rstrip("/")


def rest_base() -> str:
    """RunPod's REST API: ``RUNPOD_REST_BASE_URL``, else beside a configured GraphQL base (the
    simulator serves both), else RunPod's own."""
    explicit = os.environ.get("RUNPOD_REST_BASE_URL")
    if explicit:
        return explicit.rstrip("/")
    base = os.environ.get("RUNPOD_API_BASE_URL")
    return f"{base.rstrip('/')}/v1" if base else DEFAULT_REST_BASE


def send(method: str, url: str, *, api_key: str, payload: dict[str, Any], seconds: float = CALL_SECONDS) -> Answer:
    """One request with a total deadline and a size cap on the answer; Transient if either is hit
    or the network fails."""
    deadline = time.monotonic() + seconds
    headers = {"Authorization": f"Bearer {api_key}", "Content-Type": "application/json", "Accept-Encoding": "identity"}
    timeout = httpx.Timeout(seconds, connect=min(CONNECT_SECONDS, seconds))
    try:
        with _client().stream(method, url, headers=headers, json=payload, timeout=timeout) as response:
            chunks, size = [], 0
            for chunk in response.iter_raw():
                size += len(chunk)
                if size > MAX_ANSWER_BYTES:
                    raise Transient(f"RunPod's answer passed {MAX_ANSWER_BYTES} bytes")
                if time.monotonic() > deadline:
                    raise Transient(f"RunPod's answer took over {seconds:g} s")
                chunks.append(chunk)
            return Answer(response.status_code, dict(response.headers), b"".join(chunks))
    except httpx.HTTPError as exc:
        raise Transient(f"RunPod unreachable: {type(exc).__name__}: {exc}") from None


_clients: dict[int, httpx.Client] = {}
_clients_lock = threading.Lock()


def _client() -> httpx.Client:
    """This process's client (thread-safe; one per process, never inherited across a fork). A new
    client a call cost ~0.1 s of CPU loading the CA bundle: a dispatcher that asked RunPod about a
    pod that stopped answering failed its pages meanwhile (tests/ocrjobs/test_dispatch_preemption.py)."""
    pid = os.getpid()
    client = _clients.get(pid)
    if client is None:
        with _clients_lock:
            client = _clients.get(pid) or httpx.Client()
            _clients.clear()
            _clients[pid] = client
    return client


def check_answer(answer: Answer) -> Any:
    """The answer's JSON, or the provider error it means: 429 and 5xx are Transient (with the
    ``Retry-After`` they name), a page that is not JSON is Transient (a gateway or a challenge),
    401 is AuthFailed, a GraphQL ``errors`` list is sorted by ``classify_error``."""
    status = answer.status
    try:
        body = answer.json()
    except (ValueError, UnicodeDecodeError):
        body = None
    if status == 429 or status >= 500 or (body is None and status != 401):
        error = Transient(f"RunPod answered {status}" + ("" if body is not None else " with a page that is not JSON"))
        error.retry_after = retry_after(answer.headers.get("retry-after"))
        raise error
    if status == 401:
        raise AuthFailed(f"RunPod refused the API key ({status})")
    errors = body.get("errors") if isinstance(body, dict) else None
    if errors:
        first = errors[0] if isinstance(errors[0], dict) else {"message": str(errors[0])}
        code = (first.get("extensions") or {}).get("code")
        raise classify_error(str(first.get("message") or ""), code if isinstance(code, str) else None)
    if status == 403:
        raise AuthFailed(f"RunPod refused the request ({status})")
    if status >= 400:  # REST: {"error": ..., "code": ...}
        fields = body if isinstance(body, dict) else {}
        message, code = fields.get("error") or fields.get("message"), fields.get("code")
        raise classify_error(str(message or f"HTTP {status}"), code if isinstance(code, str) else None)
    return body


def graphql(query: str, *, api_key: str, seconds: float = CALL_SECONDS) -> dict[str, Any]:
    """``data`` of one GraphQL call, or the provider error its answer means."""
    body = check_answer(
        send("POST", f"{graphql_base()}/graphql", api_key=api_key, payload={"query": query}, seconds=seconds)
    )
    data = body.get("data") if isinstance(body, dict) else None
    if not isinstance(data, dict):
        raise Transient("RunPod answered without data")
    return data


def rest_create(payload: dict[str, Any], *, api_key: str, seconds: float = CALL_SECONDS) -> dict[str, Any]:
    """RunPod's REST create (``POST /pods``): the pod it made, or the provider error."""
    body = check_answer(send("POST", f"{rest_base()}/pods", api_key=api_key, payload=payload, seconds=seconds))
    if not isinstance(body, dict) or not body.get("id"):
        raise NoCapacity("RunPod's REST create answered no pod")
    return body
