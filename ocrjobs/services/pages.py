"""Pages, called by dispatchers: claims with a lease, which pod each page went to, results
stored once (this module writes every pod's result into the page's row; a page kept as its PDF
text layer is done in the split), failed attempts, pages given back.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from django.conf import settings
from django.db import connection, transaction
from django.db.models import F, Q
from django.utils import timezone

from ocrjobs.models import Page
from ocrjobs.services.jobs import job_refresh


@dataclass(frozen=True)
class ClaimedPage:
    id: int
    job_id: int
    position: int  # of its document in the job
    document_id: int
    source: str  # the document's name in storage (ocrjobs.storage.document_bytes)
    sha256: str  # the document's hash: the name the pods cache it under
    number: int  # the page in its document, 1-based
    languages: str
    attempts: int
    pages: int = 1  # its document's page count


def pages_claim(*, pool_id: int, token: str, limit: int, sweep: bool = True) -> list[ClaimedPage]:
    """Claim up to ``limit`` waiting pages with a lease that expires unless renewed.

    ``sweep`` also fails the pages whose claims expired on their last attempt;
    a dispatcher asks for it every few seconds rather than on every claim.
    """
    if limit <= 0:
        return []
    now = timezone.now()
    expires = now + timezone.timedelta(seconds=settings.PAGE_CLAIM_SECONDS)
    with transaction.atomic():
        if sweep:
            _fail_exhausted(pool_id=pool_id)
        # Never a page whose claim expired on its last attempt, swept or not (review L9): it is
        # still counted as waiting, so that a dispatcher comes and its sweep fails it.
        exhausted = Q(status=Page.Status.RUNNING, attempts__gte=settings.PAGE_MAX_ATTEMPTS)
        query = Page.objects.waiting().exclude(exhausted).filter(pool_id=pool_id).order_by("id")
        if connection.features.has_select_for_update_skip_locked:
            query = query.select_for_update(skip_locked=True, of=("self",))
        ids = list(query.values_list("id", flat=True)[:limit])
        if not ids:
            return []
        Page.objects.filter(id__in=ids).update(
            status=Page.Status.RUNNING,
            claim_token=token,
            claim_expires_at=expires,
            attempts=F("attempts") + 1,
            started_at=now,
            pod=None,
        )
        rows = Page.objects.filter(id__in=ids).values_list(
            "id", "job_id", "document__position", "document_id", "document__source", "document__sha256", "number",
            "job__languages", "attempts", "document__page_count",
        )  # fmt: skip
        return [ClaimedPage(*row) for row in rows]


def _fail_exhausted(*, pool_id: int) -> None:
    """Pages whose claims expired on their last attempt fail instead of looping."""
    now = timezone.now()
    exhausted = Page.objects.filter(
        pool_id=pool_id, status=Page.Status.RUNNING, claim_expires_at__lt=now,
        attempts__gte=settings.PAGE_MAX_ATTEMPTS,
    )  # fmt: skip
    job_ids = set(exhausted.values_list("job_id", flat=True))
    if job_ids:
        exhausted.update(
            status=Page.Status.FAILED,
            error=f"no result after {settings.PAGE_MAX_ATTEMPTS} attempts (claims expired)",
            finished_at=now,
            claim_token="",
        )
        for job_id in job_ids:
            transaction.on_commit(lambda job_id=job_id: job_refresh(job_id=job_id))


def claims_renew(*, token: str, page_ids: list[int]) -> set[int]:
    """Extend this token's claims on the given pages (those its holder has in hand), and say which
    of them it still holds. Never every page of the token: one that its holder lost track of must
    expire and wait again, not stay claimed for as long as the holder lives."""
    if not page_ids:
        return set()
    expires = timezone.now() + timezone.timedelta(seconds=settings.PAGE_CLAIM_SECONDS)
    with transaction.atomic():
        held = Page.objects.filter(id__in=page_ids, claim_token=token, status=Page.Status.RUNNING)
        if connection.features.has_select_for_update:
            held = held.select_for_update()  # a cancel in between would be renewed as held
        ids = set(held.values_list("id", flat=True))
        Page.objects.filter(id__in=ids).update(claim_expires_at=expires)
    return ids


def pages_assign_pods(*, token: str, assignments: list[tuple[int, int, int]]) -> None:
    """Record which pod each running page went to (one statement for many pages),
    so that a pod that goes away sends its pages back to the queue at once.

    ``assignments`` are (page id, attempt, pod id): a superseded attempt records nothing.
    """
    if not assignments:
        return
    table = Page._meta.db_table
    placeholders = ", ".join(["(CAST(%s AS bigint), CAST(%s AS integer), CAST(%s AS bigint))"] * len(assignments))
    params = [value for row in assignments for value in row] + [token, Page.Status.RUNNING]
    sql = (
        f"WITH v(id, attempts, pod_id) AS (VALUES {placeholders}) UPDATE {table} SET pod_id = v.pod_id "
        f"FROM v WHERE {table}.id = v.id AND {table}.attempts = v.attempts "
        f"AND {table}.claim_token = %s AND {table}.status = %s"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, params)


@dataclass(frozen=True)
class PageResult:
    page_id: int
    job_id: int
    position: int
    pod_id: int | None
    result: dict
    seconds: float | None = None  # how long the pod took: the busy time that its spend is shared by
    attempt: int | None = None  # the claim's attempt number; None: whichever attempt holds the claim


def result_json(result: dict) -> str:
    """A page's result as ``Page.result`` holds it: JSON text in the page's own row, which any
    host reads (no file on one host's disk). Every result is written here (a pod's, a text layer's)."""
    return json.dumps(result, ensure_ascii=False)


def _confidence(result: dict) -> float | None:
    value = result.get("confidence")
    try:
        return float(value) if value is not None else None
    except (TypeError, ValueError):
        return None


def pages_complete(*, token: str, items: list[PageResult]) -> set[int]:
    """Store many pages' results at once; each only if its claim is still ours.

    One UPDATE writes the results into the pages' rows and marks them done; a page whose
    claim was lost (expired and taken, cancelled, or superseded by a newer attempt) is not
    updated, so a page is never written twice. Of two results for one page in a batch, the
    first counts. Returns the stored ids. Safe to call again after a database error: a
    result stored by the first call no longer matches a claim.
    """
    unique: dict[int, PageResult] = {}
    for item in items:
        unique.setdefault(item.page_id, item)
    if not unique:
        return set()
    placeholders = ", ".join(
        ["(CAST(%s AS bigint), CAST(%s AS integer), CAST(%s AS text), CAST(%s AS double precision),"
         " CAST(%s AS bigint), CAST(%s AS double precision))"] * len(unique)
    )  # fmt: skip
    params: list = []
    for page_id, item in unique.items():
        params += [page_id, item.attempt, result_json(item.result), _confidence(item.result), item.pod_id,
                   item.seconds]  # fmt: skip
    table = Page._meta.db_table
    sql = (
        f"WITH v(id, attempts, result, confidence, pod_id, seconds) AS (VALUES {placeholders}) "
        f"UPDATE {table} SET status = %s, result = v.result, confidence = v.confidence, pod_id = v.pod_id, "
        f"seconds = v.seconds, "
        f"error = '', claim_token = '', claim_expires_at = NULL, finished_at = %s "
        f"FROM v WHERE {table}.id = v.id AND {table}.attempts = COALESCE(v.attempts, {table}.attempts) "
        f"AND {table}.claim_token = %s AND {table}.status = %s "
        f"RETURNING {table}.id"
    )
    params += [Page.Status.DONE, timezone.now(), token, Page.Status.RUNNING]
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(sql, params)
        return {row[0] for row in cursor.fetchall()}


def page_complete(*, page_id: int, token: str, pod_id: int | None, result: dict) -> bool:
    """Store one page's result once. False if the claim was lost (expired, cancelled, done elsewhere)."""
    page = Page.objects.filter(pk=page_id).values("job_id", "document__position").first()
    if page is None:
        return False
    item = PageResult(page_id, page["job_id"], page["document__position"], pod_id, result)
    return page_id in pages_complete(token=token, items=[item])


def page_attempt_failed(
    *, page_id: int, token: str, pod_id: int | None, error: str, final: bool = False, attempt: int | None = None
) -> str:
    """Record a failed attempt: the page waits for another, or fails when they are spent.
    ``attempt`` names the claim that failed; a superseded one changes nothing ("lost")."""
    claim = Page.objects.filter(pk=page_id, claim_token=token, status=Page.Status.RUNNING)
    if attempt is not None:
        claim = claim.filter(attempts=attempt)
    page = claim.first()
    if page is None:
        return "lost"
    claim = claim.filter(attempts=page.attempts)
    if final or page.attempts >= settings.PAGE_MAX_ATTEMPTS:
        claim.update(
            status=Page.Status.FAILED, error=error[:2000], pod_id=pod_id, claim_token="",
            claim_expires_at=None, finished_at=timezone.now(),
        )  # fmt: skip
        return "failed"
    claim.update(status=Page.Status.PENDING, error=error[:2000], claim_token="", claim_expires_at=None)
    return "retry"


def pages_requeue_preempted(*, pod_id: int) -> int:
    """The provider took an interruptible pod back: the attempts it cost its pages are given back.
    Those running on it wait again; those whose attempt on it already failed (the dispatcher saw
    the pod vanish first) and wait, not yet claimed again, keep waiting with the attempt returned.
    A late answer from the pod finds no claim and is not stored. Returns the pages given back."""
    running = Page.objects.filter(pod_id=pod_id, status=Page.Status.RUNNING).update(
        status=Page.Status.PENDING, claim_token="", claim_expires_at=None, attempts=F("attempts") - 1
    )
    failed_there = Page.objects.filter(pod_id=pod_id, status=Page.Status.PENDING, attempts__gt=0)
    return running + failed_there.update(attempts=F("attempts") - 1, pod=None)


def pages_unclaim(*, token: str, page_ids: list[int]) -> int:
    """Give pages back without spending an attempt (no lane for them, or shutting down)."""
    return Page.objects.filter(id__in=page_ids, claim_token=token, status=Page.Status.RUNNING).update(
        status=Page.Status.PENDING, claim_token="", claim_expires_at=None, attempts=F("attempts") - 1
    )


def pages_requeue_from_pod(*, pod_id: int) -> int:
    """A pod went away: its pages in flight wait again (the attempt stays counted)."""
    return Page.objects.filter(pod_id=pod_id, status=Page.Status.RUNNING).update(
        status=Page.Status.PENDING, claim_token="", claim_expires_at=None
    )
