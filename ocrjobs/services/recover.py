"""Documents whose fetch or split task was lost (a worker killed, the broker restarted) are sent
again; a URL document whose fetches lapsed too often fails. Searchable PDFs whose build was lost
likewise; one whose worker died PDF_BUILD_ATTEMPTS times fails. Run by the scaler tick (pods/tasks.py).
"""

from __future__ import annotations

import logging

from django.conf import settings
from django.utils import timezone

from fleetadmin import leases
from ocrjobs.enqueue import enqueue_searchable_pdf_builds, enqueue_split
from ocrjobs.models import Document, Job, SearchablePdf
from ocrjobs.services.fetch import fetches_exhausted
from ocrjobs.services.fetch_turns import fetches_start
from ocrjobs.services.kept_uploads import uploads_drop_expired
from ocrjobs.storage import staging_prune

log = logging.getLogger(__name__)


def documents_recover(*, pool_id: int) -> list[int]:
    """Send again the split of every waiting document whose task never started or stopped renewing
    its lease (worker killed, task lost); a URL one whose fetches lapsed too often fails, the others
    wait for a fetch slot, given in turn by owner (services/fetch_turns.py). The documents sent:
    the splits, and the fetches that took a free slot."""
    lost = leases.expired(
        Document.objects.filter(job__pool_id=pool_id, status=Document.Status.PENDING).exclude(
            job__status=Job.Status.CANCELLED
        )
    )
    documents = list(lost.values_list("pk", "kind", "fetch_attempts"))
    if not documents:
        return []
    failed = fetches_exhausted(lost.filter(kind=Document.Kind.URL)) if any(n for _, _, n in documents) else set()
    documents = [(pk, kind) for pk, kind, _ in documents if pk not in failed]
    splits = [pk for pk, kind in documents if kind != Document.Kind.URL]
    if splits:
        Document.objects.filter(pk__in=splits).update(**leases.queued())
        log.warning("pool %s: sending again %d splits whose tasks were lost", pool_id, len(splits))
    for document_id in splits:
        enqueue_split(document_id)
    return splits + fetches_start()


def searchable_pdfs_recover() -> list[int]:
    """Send again the build of every searchable PDF whose task never started or stopped renewing
    its lease (the broker lost it, its worker died); a build whose worker died PDF_BUILD_ATTEMPTS
    times since it was asked for (a document that kills it) fails, saying so. The documents sent."""
    lost = leases.expired(
        SearchablePdf.objects.filter(status__in=(SearchablePdf.Status.PENDING, SearchablePdf.Status.BUILDING))
    )
    attempts = settings.PDF_BUILD_ATTEMPTS
    died = lost.filter(status=SearchablePdf.Status.BUILDING, attempts__gte=attempts).update(
        status=SearchablePdf.Status.FAILED, task_lease_until=None, updated_at=timezone.now(),
        error=f"its build stopped without an end {attempts} times (its worker died: out of memory?); a rebuild tries once more",
    )  # fmt: skip
    if died:
        log.warning("%d searchable PDFs failed: their builds' workers died %d times", died, attempts)
    document_ids = list(lost.values_list("pk", flat=True))
    if not document_ids:
        return []
    SearchablePdf.objects.filter(pk__in=document_ids).update(**leases.queued())
    log.warning("sending again %d searchable PDF builds whose tasks were lost", len(document_ids))
    enqueue_searchable_pdf_builds(document_ids)
    return document_ids


def housekeeping_minute() -> None:
    """The minute's scaler tick's housekeeping (``pods.hooks`` ``minute_housekeeping``): staging
    directories a dead front left and kept uploads past their expiry (as ``prune_staging``), then
    the searchable PDF builds whose tasks were lost."""
    staging_prune()
    uploads_drop_expired()
    searchable_pdfs_recover()
