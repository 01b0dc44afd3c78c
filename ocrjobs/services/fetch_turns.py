"""Fetch slots taken in turn by owner (review N6, invariant 19): which URL documents' fetches start.

A URL document waits for a slot with its lease lapsed (``waiting``) and no task sent. A slot is
handed out (its lease queued, its fetch task sent) by ``fetches_start``: when a submission or a
retry commits, when a fetch ends (ocrjobs/services/fetch.py hands its slot on), and at the scaler
tick (a task the broker lost). It takes turns by owner (fleetadmin/fairshare.py) under
URL_FETCH_MAX_IN_FLIGHT, URL_FETCH_MAX_IN_FLIGHT_PER_OWNER and URL_FETCH_MAX_IN_FLIGHT_PER_HOST:
one job of 1,000 slow URLs holds its owner's share of the slots, not every slot for hours, and
its waiting documents are rows, not a thousand tasks bouncing through the short-task queue.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from fleetadmin import fairshare, leases
from ocrjobs.enqueue import enqueue_fetch
from ocrjobs.models import Document, Job, OwnerTurn
from ocrjobs.services import turns

log = logging.getLogger(__name__)


def waiting() -> dict:
    """Field values for a URL document that waits for a fetch slot: its lease lapsed, no task."""
    return {"task_lease_until": timezone.now() - timedelta(seconds=1), "task_lease_token": ""}


def _url_documents():
    return Document.objects.filter(kind=Document.Kind.URL, status=Document.Status.PENDING)


def fetches_start(*, now=None) -> list[int]:
    """Give the free fetch slots, in turn by owner, to URL documents waiting for one; the ids
    whose fetch was sent. A fetch sent (lease queued) or running (lease held) holds a slot. Two
    of these at the same instant may both give a slot (a soft cap, as the fetch's own check)."""
    now = now or timezone.now()
    held = _url_documents().filter(task_lease_until__gte=now).values_list("job__owner_id", "url")
    held = [fairshare.Held(owner, fairshare.host_of(url)) for owner, url in held]
    slots = settings.URL_FETCH_MAX_IN_FLIGHT
    if len(held) >= slots:
        return []
    lapsed = _url_documents().filter(task_lease_until__lt=now).exclude(job__status=Job.Status.CANCELLED)
    per_owner = settings.URL_FETCH_MAX_IN_FLIGHT_PER_OWNER
    rows = turns.each_owners_first(lapsed, owner="job__owner_id", first="pk", fields=("pk", "job__owner_id", "url"),
                                   count=per_owner + slots)  # fmt: skip
    candidates = [fairshare.Waiting(pk, owner, fairshare.host_of(url)) for pk, owner, url in rows]
    chosen = fairshare.take_turns(held=held, waiting=candidates, slots=slots, per_owner=per_owner,
                                  per_host=settings.URL_FETCH_MAX_IN_FLIGHT_PER_HOST,
                                  served=turns.served(OwnerTurn.Kind.FETCH, {c.owner for c in candidates}))  # fmt: skip
    owner_of = {c.id: c.owner for c in candidates}
    started = []
    for document_id in chosen:
        # Only if still waiting (no other start took it meanwhile), in one statement.
        if leases.expired(_url_documents().filter(pk=document_id)).update(**leases.queued()):
            enqueue_fetch(document_id)
            started.append(document_id)
    turns.turns_taken(OwnerTurn.Kind.FETCH, [owner_of[pk] for pk in started])
    if started:
        log.info("fetches sent in turn by owner: documents %s", started)
    return started
