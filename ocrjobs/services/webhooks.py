"""Webhooks: when a job ends (done, partial, failed, cancelled) its callback URL is posted a
JSON event, signed with HMAC-SHA256 under its owner's secret.

A delivery is a row. Passes (pods/services/passes.py) claim the due ones, at most
WEBHOOK_MAX_IN_FLIGHT at a time, and send each attempt to a short task of its own: a pass never
waits on a receiver. An attempt is one POST within WEBHOOK_TIMEOUT_SECONDS in all, to the address
that was checked (public only, pinned: ocrjobs/services/remote.py), counted when it starts. A
2xx delivers it; anything else schedules the next attempt with back-off, for a day. Nothing
sleeps in a worker (invariant 15).

What a receiver checks::

    X-Fleetadmin-Timestamp: 1764600000
    X-Fleetadmin-Signature: sha256=<hex of HMAC-SHA256(secret, "1764600000." + body)>

that one of the signatures matches (after a rotation the header carries one more, under the
secret before, for WEBHOOK_SECRET_GRACE_SECONDS, comma-separated), and that the timestamp is recent
(it is signed, so an old event cannot be replayed as new). The body's ``delivery`` (signed, unlike
the X-Fleetadmin-Delivery header) is the same for every attempt of one event: a receiver that
keeps the ones it has seen takes each event once.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import secrets
import time
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from fleetadmin import fairshare, leases
from fleetadmin.errors import Conflict, DomainError
from ocrjobs.enqueue import enqueue_delivery
from ocrjobs.models import Job, OwnerTurn, WebhookDelivery, WebhookSecret
from ocrjobs.services import remote, turns
from ocrjobs.services.urls import check_url
from pods.services.passes import pass_request

log = logging.getLogger(__name__)

# Seconds after the previous attempt; the last repeats until a day has gone by.
BACKOFF_SECONDS = [10, 30, 60, 120, 300, 600, 1800, 3600, 7200]
RETRY_FOR = timedelta(days=1)
EVENT_STATUSES = (Job.Status.DONE, Job.Status.PARTIAL, Job.Status.FAILED, Job.Status.CANCELLED)


def _new_secret() -> str:
    return f"whsec_{secrets.token_hex(24)}"


def webhook_secret_row(owner) -> WebhookSecret:
    """The owner's signing secret's row, made on first use."""
    row, _ = WebhookSecret.objects.get_or_create(owner=owner, defaults={"secret": _new_secret()})
    return row


def webhook_secret_for(owner) -> str:
    """The owner's signing secret, made on first use."""
    return webhook_secret_row(owner).secret


def webhook_secrets_signing(owner, *, now: datetime | None = None) -> list[str]:
    """The secrets an event of the owner's is signed with: the current one, and the one before
    it while its grace after a rotation lasts."""
    row = webhook_secret_row(owner)
    now = now or timezone.now()
    if row.previous_secret and row.previous_until and row.previous_until > now:
        return [row.secret, row.previous_secret]
    return [row.secret]


def webhook_secret_rotate(owner) -> WebhookSecret:
    """A new secret for the owner's events; the one before still signs them (a second signature)
    for WEBHOOK_SECRET_GRACE_SECONDS, while receivers move to the new one."""
    with transaction.atomic():
        row = webhook_secret_row(owner)
        row = WebhookSecret.objects.select_for_update().get(pk=row.pk)
        grace = timezone.timedelta(seconds=settings.WEBHOOK_SECRET_GRACE_SECONDS)
        row.previous_secret, row.previous_until = row.secret, timezone.now() + grace
        row.secret, row.created_at = _new_secret(), timezone.now()
        row.save()
    log.info("webhook secret of user %s rotated; the one before signs too until %s", owner.pk, row.previous_until)
    return row


def check_callback_url(url: str | None) -> str:
    """A callback URL as a document URL is checked in the front: http(s), a host, no literal
    private or loopback address (names are resolved and checked at each attempt)."""
    if not url:
        return ""
    try:
        return check_url(url)
    except DomainError as exc:
        raise type(exc)(f"callback_url: {exc.message}", field="callback_url") from None


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
    pass_request()


def deliveries_due(*, now: datetime, limit: int) -> list[int]:
    """Due deliveries a pass may send now, taken in turn by owner (fleetadmin/fairshare.py): no
    more than fit under WEBHOOK_MAX_IN_FLIGHT, WEBHOOK_MAX_IN_FLIGHT_PER_OWNER of one owner's and
    WEBHOOK_MAX_IN_FLIGHT_PER_HOST to one host. So ~900 cancelled jobs with tarpit callback URLs
    hold one owner's share of the slots, and another owner's event goes at once (review N6)."""
    due = WebhookDelivery.objects.due(now=now).order_by("next_attempt_at", "pk")
    if not due[:1].exists():  # the usual answer, in one query
        return []
    held = WebhookDelivery.objects.in_flight(now=now).values_list("job__owner_id", "url")
    held = [fairshare.Held(owner, fairshare.host_of(url)) for owner, url in held]
    if len(held) >= settings.WEBHOOK_MAX_IN_FLIGHT:
        return []
    per_owner = settings.WEBHOOK_MAX_IN_FLIGHT_PER_OWNER
    rows = turns.each_owners_first(due, owner="job__owner_id", first="next_attempt_at",
                                   fields=("pk", "job__owner_id", "url"), count=per_owner + settings.WEBHOOK_MAX_IN_FLIGHT)  # fmt: skip
    waiting = [fairshare.Waiting(pk, owner, fairshare.host_of(url)) for pk, owner, url in rows]
    chosen = fairshare.take_turns(held=held, waiting=waiting, slots=settings.WEBHOOK_MAX_IN_FLIGHT,
                                  per_owner=per_owner, per_host=settings.WEBHOOK_MAX_IN_FLIGHT_PER_HOST,
                                  served=turns.served(OwnerTurn.Kind.WEBHOOK, {w.owner for w in waiting}))[:limit]  # fmt: skip
    return chosen


def delivery_send(delivery_id: int) -> str:
    """A pass's step for a due delivery: claim it (its lease, so it counts in flight until its
    attempt ends or the lease lapses) and send its attempt to a short task. Database only: the
    pass never waits on a receiver (review H1)."""
    now = timezone.now()
    row = WebhookDelivery.objects.due(now=now).filter(pk=delivery_id)
    lease = leases.acquire(row, seconds=settings.TASK_START_GRACE_SECONDS)
    if lease is None:
        return "not due"
    owner = WebhookDelivery.objects.filter(pk=delivery_id).values_list("job__owner_id", flat=True).first()
    turns.turns_taken(OwnerTurn.Kind.WEBHOOK, [owner])  # its owner's turn goes to the back
    transaction.on_commit(lambda: enqueue_delivery(delivery_id, lease))
    return "sent"


def delivery_attempt(*, delivery_id: int, lease: str) -> str:
    """One attempt of a delivery this task holds the lease of: its new state.

    The attempt is recorded when it starts, its back-off already counted, so an attempt killed
    mid-way (its worker stopped) still ages the delivery toward ``failed``, and the next one
    waits its turn. The POST has a total deadline (WEBHOOK_TIMEOUT_SECONDS) and reads nothing but
    the status line and headers."""
    row = WebhookDelivery.objects.filter(pk=delivery_id, state=WebhookDelivery.State.PENDING, task_lease_token=lease)
    delivery = row.select_related("job", "job__owner").first()
    if delivery is None:
        return "not this task's"
    now = timezone.now()
    if delivery.attempts and now >= delivery.created_at + RETRY_FOR:
        row.update(state=WebhookDelivery.State.FAILED, next_attempt_at=None, task_lease_until=now)
        return WebhookDelivery.State.FAILED
    attempts = [*delivery.attempts, {"at": now.isoformat()}]
    retry_at = now + timedelta(seconds=_backoff(len(attempts)))
    in_flight_until = now + timedelta(seconds=settings.WEBHOOK_TIMEOUT_SECONDS + settings.TASK_LEASE_SECONDS)
    if not row.update(attempts=attempts, next_attempt_at=retry_at, task_lease_until=in_flight_until):
        return "not this task's"
    started = time.monotonic()
    try:
        status = _post(delivery)
        attempts[-1]["status"] = status
    except DomainError as exc:
        status = None
        attempts[-1]["error"] = exc.message[:500]
    attempts[-1]["seconds"] = round(time.monotonic() - started, 3)
    ended = timezone.now()
    if status is not None and 200 <= status < 300:
        fields = {"state": WebhookDelivery.State.DELIVERED, "delivered_at": ended, "next_attempt_at": None}
    else:
        retry_at = ended + timedelta(seconds=_backoff(len(attempts)))
        if retry_at > delivery.created_at + RETRY_FOR:
            fields = {"state": WebhookDelivery.State.FAILED, "next_attempt_at": None}
        else:
            fields = {"next_attempt_at": retry_at}
    row.update(attempts=attempts, task_lease_until=ended, **fields)
    log.info("webhook %s of job %s: %s", delivery_id, delivery.job_id, attempts[-1])
    return fields.get("state", WebhookDelivery.State.PENDING)


def _backoff(attempts: int) -> int:
    """Seconds from the start of attempt number ``attempts`` to the next one."""
    return BACKOFF_SECONDS[min(attempts - 1, len(BACKOFF_SECONDS) - 1)]


def _post(delivery: WebhookDelivery) -> int:
    """POST the signed event to the checked, pinned address, within WEBHOOK_TIMEOUT_SECONDS in
    all; the HTTP status (redirects are not followed: a receiver answers where it was told to be;
    its body is never read)."""
    if delivery.job.owner is None:
        raise Conflict("the job has no owner whose secret could sign the event")
    # The delivery's id inside the signed body (the header alone could be changed in transit).
    body = json.dumps({"delivery": str(delivery.pk), **json.loads(delivery.body)}).encode()
    timestamp = int(time.time())
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "fleetadmin-webhooks",
        "X-Fleetadmin-Event": f"job.{delivery.event}",
        "X-Fleetadmin-Delivery": str(delivery.pk),
        "X-Fleetadmin-Timestamp": str(timestamp),
        "X-Fleetadmin-Signature": ", ".join(
            sign(secret, timestamp, body) for secret in webhook_secrets_signing(delivery.job.owner)
        ),
    }
    deadline = remote.Deadline(settings.WEBHOOK_TIMEOUT_SECONDS)
    with remote.exchange("POST", delivery.url, deadline=deadline, max_bytes=0, headers=headers,
                         content=body) as answer:  # fmt: skip
        return answer.status
