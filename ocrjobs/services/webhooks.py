"""Webhooks: when a job ends (done, partial, failed, cancelled) its callback URL is posted a
JSON event, signed with HMAC-SHA256 under its owner's secret.

A delivery is a row. Passes (pods/services/passes.py) take the due ones and make one attempt
each: one POST with a short time limit, to the address that was checked (public only, pinned
as URL documents are: ocrjobs/services/fetch.py). A 2xx delivers it; anything else schedules
the next attempt with back-off, for a day. Nothing sleeps in a worker (invariant 15).

What a receiver checks::

    X-Fleetadmin-Timestamp: 1764600000
    X-Fleetadmin-Signature: sha256=<hex of HMAC-SHA256(secret, "1764600000." + body)>

and that the timestamp is recent (it is signed, so an old event cannot be replayed as new).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import secrets
import socket
import time
import urllib.parse
from datetime import datetime, timedelta

import httpx
from django.db import transaction
from django.utils import timezone

from fleetadmin.api import ApiError
from ocrjobs.models import Job, WebhookDelivery, WebhookSecret
from ocrjobs.services.urls import address_allowed, check_url

log = logging.getLogger(__name__)

# Seconds after the previous attempt; the last repeats until a day has gone by.
BACKOFF_SECONDS = [10, 30, 60, 120, 300, 600, 1800, 3600, 7200]
RETRY_FOR = timedelta(days=1)
ATTEMPT_TIMEOUT_SECONDS = 10.0
EVENT_STATUSES = (Job.Status.DONE, Job.Status.PARTIAL, Job.Status.FAILED, Job.Status.CANCELLED)


def webhook_secret_for(owner) -> str:
    """The owner's signing secret, made on first use."""
    row, _ = WebhookSecret.objects.get_or_create(owner=owner, defaults={"secret": f"whsec_{secrets.token_hex(24)}"})
    return row.secret


def check_callback_url(url: str | None) -> str:
    """A callback URL as a document URL is checked in the front: http(s), a host, no literal
    private or loopback address (names are resolved and checked at each attempt)."""
    if not url:
        return ""
    try:
        return check_url(url)
    except ApiError as exc:
        raise ApiError(f"callback_url: {exc.message}", exc.status) from None


def sign(secret: str, timestamp: int, body: bytes) -> str:
    return "sha256=" + hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()


def webhook_enqueue(*, job: Job) -> WebhookDelivery | None:
    """Queue the event of a job that just ended, in the caller's transaction (the one that ended
    it), and ask for a pass once it commits. Nothing for a job without a callback URL."""
    if not job.callback_url or job.status not in EVENT_STATUSES:
        return None
    body = json.dumps(
        {
            "event": f"job.{job.status}",
            "job": {
                "id": job.pk,
                "status": job.status,
                "pool": job.pool.key,
                "created_at": job.created_at.isoformat(),
                "finished_at": job.finished_at.isoformat() if job.finished_at else None,
                "pages": job.page_counts(),
                "urls": {"self": f"/v1/jobs/{job.pk}", "result_jsonl": f"/v1/jobs/{job.pk}/result.jsonl"},
            },
        }
    )
    now = timezone.now()
    delivery = WebhookDelivery.objects.create(
        job=job, event=job.status, url=job.callback_url, body=body, next_attempt_at=now, created_at=now
    )
    transaction.on_commit(_ask_for_a_pass)
    return delivery


def _ask_for_a_pass() -> None:
    from pods.services.passes import pass_request

    pass_request()


def deliveries_due(*, now: datetime, limit: int) -> list[int]:
    return list(WebhookDelivery.objects.due(now=now).order_by("next_attempt_at").values_list("pk", flat=True)[:limit])


def delivery_step(delivery_id: int) -> str:
    """One attempt of a due delivery: its new state. The row is claimed first (its next attempt
    moved past this one's time limit), so two passes never post it twice at once."""
    now = timezone.now()
    claim_until = now + timedelta(seconds=ATTEMPT_TIMEOUT_SECONDS * 3)
    claimed = WebhookDelivery.objects.due(now=now).filter(pk=delivery_id).update(next_attempt_at=claim_until)
    if not claimed:
        return "not due"
    delivery = WebhookDelivery.objects.select_related("job").get(pk=delivery_id)
    started = time.monotonic()
    outcome: dict = {"at": now.isoformat()}
    try:
        status = _post(delivery)
        outcome["status"] = status
    except ApiError as exc:
        status = None
        outcome["error"] = exc.message[:500]
    outcome["seconds"] = round(time.monotonic() - started, 3)
    attempts = [*delivery.attempts, outcome]
    ended = timezone.now()
    if status is not None and 200 <= status < 300:
        fields = {"state": WebhookDelivery.State.DELIVERED, "delivered_at": ended, "next_attempt_at": None}
    else:
        delay = BACKOFF_SECONDS[min(len(attempts) - 1, len(BACKOFF_SECONDS) - 1)]
        retry_at = ended + timedelta(seconds=delay)
        if retry_at > delivery.created_at + RETRY_FOR:
            fields = {"state": WebhookDelivery.State.FAILED, "next_attempt_at": None}
        else:
            fields = {"next_attempt_at": retry_at}
    WebhookDelivery.objects.filter(pk=delivery_id).update(attempts=attempts, **fields)
    log.info("webhook %s of job %s: %s", delivery_id, delivery.job_id, outcome)
    return fields.get("state", WebhookDelivery.State.PENDING)


def _post(delivery: WebhookDelivery) -> int:
    """POST the signed event to the checked, pinned address; the HTTP status (redirects are not
    followed: a receiver answers where it was told to be)."""
    from ocrjobs.services.fetch import _pinned  # fetch imports the split, which imports much

    url = check_url(delivery.url)
    parts = urllib.parse.urlsplit(url)
    try:
        addresses = [info[4][0] for info in socket.getaddrinfo(parts.hostname, parts.port or None)]
    except socket.gaierror as exc:
        raise ApiError(f"{parts.hostname}: the name does not resolve ({exc.strerror})") from None
    if not addresses or not all(address_allowed(address) for address in addresses):
        raise ApiError(f"{parts.hostname}: resolves to a private or loopback address; refused")
    if delivery.job.owner is None:
        raise ApiError("the job has no owner whose secret could sign the event")
    body = delivery.body.encode()
    timestamp = int(time.time())
    target, pinning = _pinned(url, addresses[0])
    headers = {
        **pinning["headers"],
        "Content-Type": "application/json",
        "User-Agent": "fleetadmin-webhooks",
        "X-Fleetadmin-Event": f"job.{delivery.event}",
        "X-Fleetadmin-Delivery": str(delivery.pk),
        "X-Fleetadmin-Timestamp": str(timestamp),
        "X-Fleetadmin-Signature": sign(webhook_secret_for(delivery.job.owner), timestamp, body),
    }
    try:
        with httpx.Client(timeout=ATTEMPT_TIMEOUT_SECONDS, follow_redirects=False) as client:
            response = client.post(target, content=body, headers=headers, extensions=pinning["extensions"])
    except httpx.HTTPError as exc:
        raise ApiError(f"the post failed ({exc.__class__.__name__}: {exc})") from None
    return response.status_code
