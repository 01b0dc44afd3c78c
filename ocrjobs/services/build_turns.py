"""Searchable PDF builds taken in turn by owner (issue 38, invariant 19): which document an outputs
worker builds next.

A build task (ocrjobs/output_tasks.py) no longer builds the documents it was sent with, in the
order they were asked: it builds the next waiting document in turn by owner (fleetadmin/
fairshare.py: the owner building the fewest, then the one served longest ago) under
PDF_BUILDS_PER_OWNER, again and again until none may start or BUILD_TURN_SECONDS have passed
(then it sends one more task for the rest, so that no task nears the cluster's time limit). So
a rebuild storm by one user queues behind the others' builds, not in front of them: another
user's searchable PDF waits one build, not twenty. A task sent for documents another task built
already finds nothing and ends.
"""

from __future__ import annotations

import logging
import time

from django.conf import settings
from django.utils import timezone

from fleetadmin import fairshare, leases
from ocrjobs.enqueue import enqueue_searchable_pdf_builds
from ocrjobs.models import OwnerTurn, SearchablePdf
from ocrjobs.services import turns
from ocrjobs.services.searchable_pdf import searchable_pdf_build

log = logging.getLogger(__name__)

# A task's builds end after this long, and a new task takes the rest (the outputs cluster's time
# limit is Q_TIMEOUT, 900 s by default; a build is seconds: bench/searchable_pdf.py).
BUILD_TURN_SECONDS = 120.0


def build_next(*, tried: set[int]) -> int | None:
    """The document whose searchable PDF is built next, in turn by owner (its owner's turn goes
    to the back); None when none waits that may start. ``tried``: documents this task took already."""
    now = timezone.now()
    rows = SearchablePdf.objects.filter(status__in=(SearchablePdf.Status.PENDING, SearchablePdf.Status.BUILDING))
    building = rows.filter(status=SearchablePdf.Status.BUILDING, task_lease_until__gte=now).exclude(task_lease_token="")
    held = [fairshare.Held(owner) for owner in building.values_list("document__job__owner_id", flat=True)]
    waiting = leases.free(rows.filter(status=SearchablePdf.Status.PENDING), now=now).exclude(pk__in=tried)
    per_owner = settings.PDF_BUILDS_PER_OWNER
    found = turns.each_owners_first(waiting, owner="document__job__owner_id", first="pk",
                                    fields=("pk", "document__job__owner_id"), count=per_owner + 1)  # fmt: skip
    candidates = [fairshare.Waiting(pk, owner) for pk, owner in found]
    chosen = fairshare.take_turns(held=held, waiting=candidates, slots=len(held) + 1, per_owner=per_owner,
                                  served=turns.served(OwnerTurn.Kind.BUILD, {c.owner for c in candidates}))  # fmt: skip
    if not chosen:
        return None
    turns.turns_taken(OwnerTurn.Kind.BUILD, [next(c.owner for c in candidates if c.id == chosen[0])])
    return chosen[0]


def searchable_pdfs_build_in_turn(*, seconds: float = BUILD_TURN_SECONDS) -> list[int]:
    """Build waiting searchable PDFs, the next in turn each time, until none may start or
    ``seconds`` have passed (then one more task is sent for the rest); the documents taken."""
    started, tried = time.monotonic(), set()
    while (document_id := build_next(tried=tried)) is not None:
        tried.add(document_id)
        searchable_pdf_build(document_id=document_id)
        if time.monotonic() - started >= seconds:
            log.info("searchable PDFs: %d built in turn in %.0f s; a new task takes the rest", len(tried), seconds)
            enqueue_searchable_pdf_builds([document_id])
            break
    return sorted(tried)
