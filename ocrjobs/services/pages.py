"""Pages, called by dispatchers: claims with a lease, which pod each page went to, results
stored once (this module writes every pod's result into the page's row; a page kept as its PDF
text layer is done in the split), failed attempts, pages given back.

Length: every change of a page's state under a claim is here, together (claim, result, the
cascade's move, failed attempt, preemption's give-back), so that each guard is read beside the others.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from decimal import Decimal
from typing import NamedTuple

from django.conf import settings
from django.db import connection, transaction
from django.db.models import F, Q
from django.utils import timezone

from fleetadmin.sqlbatch import id_list, ids_in, joined_by_hash, rows_table
from ocrjobs.models import Job, Page, claim_order, lowest_line_confidence
from ocrjobs.services.jobs import job_refresh
from pods.enqueue import nudge_scaler
from pods.models import Pod
from podserver.answers import PageAnswer


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
    size: int = 0  # its document's bytes (0: not known)


def pages_claim(*, pool_id: int, token: str, limit: int, sweep: bool = True) -> list[ClaimedPage]:
    """Claim up to ``limit`` waiting pages with a lease that expires unless renewed: those whose
    claims expired first (they have waited longest), then pending pages in ``claim_order`` (a job at
    a time, and its documents' pages in strips: ocrjobs/models.py CLAIM_STRIP_PAGES). Returned in
    that order.

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
        waiting = Page.objects.exclude(job__status=Job.Status.CANCELLED).filter(pool_id=pool_id)
        expired = waiting.filter(status=Page.Status.RUNNING, claim_expires_at__lt=now).exclude(_attempts_spent())
        ids = _claimable(expired.order_by("id"), limit)
        if len(ids) < limit:
            # Each its own statement: pending pages come by page_claim_order_idx, in its order.
            pending = waiting.filter(status=Page.Status.PENDING).order_by(*claim_order())
            ids += _claimable(pending, limit - len(ids))
        if not ids:
            return []
        claimed = Page.objects.filter(id__in=id_list(ids))  # the ids as one parameter (fleetadmin/sqlbatch.py)
        claimed.update(
            status=Page.Status.RUNNING,
            claim_token=token,
            claim_expires_at=expires,
            attempts=F("attempts") + 1,
            started_at=now,
            pod=None,
        )
        rows = claimed.values_list(
            "id", "job_id", "document__position", "document_id", "document__source", "document__sha256", "number",
            "job__languages", "attempts", "document__page_count", "document__size_bytes",
        )  # fmt: skip
        order = {page_id: turn for turn, page_id in enumerate(ids)}
        return sorted((ClaimedPage(*row) for row in rows), key=lambda page: order[page.id])


def _claimable(query, limit: int) -> list[int]:
    """The ids of the first ``limit`` pages of ``query``, locked; skipping those that another
    dispatcher's claim holds locked now (PostgreSQL)."""
    if connection.features.has_select_for_update_skip_locked:
        query = query.select_for_update(skip_locked=True, of=("self",))
    return list(query.values_list("id", flat=True)[:limit])


def _fail_exhausted(*, pool_id: int) -> None:
    """Pages whose claims expired on their last attempt fail instead of looping."""
    now = timezone.now()
    exhausted = Page.objects.filter(
        _attempts_spent(), pool_id=pool_id, status=Page.Status.RUNNING, claim_expires_at__lt=now
    )
    # An escalated page whose second pool gave nothing keeps its first reading (done), one by one:
    # few pages, and each row's own result is rewritten.
    for page in exhausted.exclude(escalated_from=None).select_related("escalated_from", "pool"):
        Page.objects.filter(pk=page.pk, status=Page.Status.RUNNING, attempts=page.attempts).update(
            **first_reading_kept(page, f"no result after {settings.PAGE_MAX_ATTEMPTS} attempts (claims expired)")
        )
        transaction.on_commit(lambda job_id=page.job_id: job_refresh(job_id=job_id))
    exhausted = exhausted.filter(escalated_from=None)
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


def claims_renew(*, token: str, page_ids: list[int], within: float | None = None) -> set[int]:
    """Extend this token's claims on the given pages (those its holder has in hand), and say which
    of them it still holds. Never every page of the token: one that its holder lost track of must
    expire and wait again, not stay claimed for as long as the holder lives.

    ``within``: renew only the claims that expire within that many seconds (None: all of them).
    A row renewed is a row written again, every index of it too: a dispatcher with 4,000 pages in
    hand that renewed every one at every beat wrote 2,000 rows a second for nothing."""
    if not page_ids:
        return set()
    now = timezone.now()
    expires = now + timezone.timedelta(seconds=settings.PAGE_CLAIM_SECONDS)
    # Guarded by the token alone: a token is only on a running page (page_claim_only_running).
    # The ids as one parameter (fleetadmin/sqlbatch.py).
    table = Page._meta.db_table
    ids, params = ids_in(page_ids)
    guard = f"id {ids} AND claim_token = %s"
    adapt = connection.ops.adapt_datetimefield_value
    with connection.cursor() as cursor:
        if within is None:
            cursor.execute(f"UPDATE {table} SET claim_expires_at = %s WHERE {guard} RETURNING id",
                           [adapt(expires), *params, token])  # fmt: skip
            return {row[0] for row in cursor.fetchall()}
        due = now + timezone.timedelta(seconds=within)
        cursor.execute(f"UPDATE {table} SET claim_expires_at = %s WHERE {guard} AND claim_expires_at < %s",
                       [adapt(expires), *params, token, adapt(due)])  # fmt: skip
        cursor.execute(f"SELECT id FROM {table} WHERE {guard}", [*params, token])
        return {row[0] for row in cursor.fetchall()}


_ASSIGNMENT = [("id", "bigint"), ("attempts", "integer"), ("pod_id", "bigint")]


def pages_assign_pods(*, token: str, assignments: list[tuple[int, int, int]]) -> None:
    """Record which pod each running page went to (one statement for many pages),
    so that a pod that goes away sends its pages back to the queue at once.

    ``assignments`` are (page id, attempt, pod id): a superseded attempt records nothing.
    """
    if not assignments:
        return
    table = Page._meta.db_table
    values, params = rows_table("v", _ASSIGNMENT, assignments)
    by_id, id_params = _by_id(table, [page_id for page_id, _, _ in assignments])
    sql = f"WITH {values} UPDATE {table} SET pod_id = v.pod_id FROM v WHERE {by_id} AND {table}.attempts = v.attempts"
    with joined_by_hash(), connection.cursor() as cursor:
        cursor.execute(sql, [*params, *id_params, token])


@dataclass(frozen=True)
class PageResult:
    page_id: int
    job_id: int
    position: int
    pod_id: int | None
    result: PageAnswer  # the pod's answer, parsed once by the dispatcher
    seconds: float | None = None  # how long the pod took: the busy time that its spend is shared by
    attempt: int | None = None  # the claim's attempt number; None: whichever attempt holds the claim


def result_json(result: dict | PageAnswer) -> str:
    """A page's result as ``Page.result`` holds it: JSON text in the page's own row, which any
    host reads (no file on one host's disk). Every result is written here (a pod's, a text layer's):
    a pod's as it sent it, with what the control plane added (warnings, the cascade's stages)."""
    if isinstance(result, PageAnswer):
        return result.model_dump_json(exclude_unset=True)
    return json.dumps(result, ensure_ascii=False)


def _stored_answer(stored: str) -> PageAnswer:
    """A reading stored earlier (a first stage's), typed again; an unreadable one reads as empty."""
    try:
        return (
            PageAnswer.model_validate_json(stored) if stored else PageAnswer.model_construct(text="", _fields_set=set())
        )
    except ValueError:  # pydantic's ValidationError is one
        return PageAnswer.model_construct(text="", _fields_set=set())


def pages_complete(*, token: str, items: list[PageResult]) -> set[int]:
    """Store many pages' results at once; each only if its claim is still ours.

    One UPDATE writes the results into the pages' rows and marks them done; a page whose
    claim was lost (expired and taken, cancelled, or superseded by a newer attempt) is not
    updated, so a page is never written twice. Of two results for one page in a batch, the
    first counts. Returns the stored ids. Safe to call again after a database error: a
    result stored by the first call no longer matches a claim.

    The cascade (issue 26): a page its pool read below the pool's escalation threshold is not
    done but moved, in the same kind of guarded UPDATE, to the escalation pool's queue with its
    first reading kept (``escalate``): the database holds the page in every state, and only a
    page never escalated moves. Its second reading is stored as any result, with both stages'
    engines and confidences in it.
    """
    unique: dict[int, PageResult] = {}
    for item in items:
        unique.setdefault(item.page_id, item)
    if not unique:
        return set()
    # Most pages take no part in a cascade: stored by one guarded UPDATE that reads nothing first
    # (a read of every batch's pools cost the dispatcher a fifth of its pages a second).
    stored = _store_done(token=token, items={pid: (item, item.result) for pid, item in unique.items()},
                         also=_NO_CASCADE)  # fmt: skip
    rest = {page_id: item for page_id, item in unique.items() if page_id not in stored}
    return stored | (_complete_in_cascade(token=token, items=rest) if rest else set())


class _InCascade(NamedTuple):
    """What ``_complete_in_cascade`` reads of a page it holds: its pool and where that escalates."""

    pool_id: int
    pool_key: str
    to_pool: int | None
    threshold: float | None
    from_key: str | None  # the pool it was escalated from (None: its first reading)
    first_result: str
    to_key: str | None
    max_dollars: Decimal | None  # its job's budget
    owner_id: int | None  # its job's owner, whose rights the escalation pool must grant


def _complete_in_cascade(*, token: str, items: dict[int, PageResult]) -> set[int]:
    """The pages the plain store left: in a pool that escalates, escalated already, or no longer
    ours (read here and skipped)."""
    held = Page.objects.filter(id__in=list(items), claim_token=token, status=Page.Status.RUNNING)
    stages = {
        row[0]: _InCascade(*row[1:])
        for row in held.values_list(
            "id", "pool_id", "pool__key", "pool__escalation_pool_id", "pool__escalation_threshold",
            "escalated_from__key", "first_result", "pool__escalation_pool__key", "job__max_dollars", "job__owner_id",
        )
    }  # fmt: skip
    done: dict[int, tuple[PageResult, dict]] = {}
    escalate: dict[int, tuple[PageResult, int]] = {}
    for page_id, item in items.items():
        if page_id not in stages:
            continue  # the claim is not ours (the UPDATE would not match either)
        stage = stages[page_id]
        confidence = item.result.confidence
        if stage.from_key:
            done[page_id] = (item, _escalated_result(item.result, first=stage.first_result, first_pool=stage.from_key,
                                                     pool=stage.pool_key))  # fmt: skip
        elif not stage.to_pool or stage.to_pool == stage.pool_id or stage.threshold is None:
            done[page_id] = (item, item.result)
        elif confidence is None or confidence < stage.threshold:
            escalate[page_id] = (item, stage.to_pool)
        else:  # kept by a pool that escalates: the cascade's verdict is in the result too
            cascade = [_stage(item.result, stage.pool_key)]
            done[page_id] = (item, _with(item.result, escalated=False, cascade=cascade))
    # function-level: the budget's module keeps first readings with this one's helpers
    from ocrjobs.services.escalation_budget import NOT_OPEN, escalations_refused, jobs_at_budget

    refused = escalations_refused({(stages[page_id].owner_id, to_pool) for page_id, (_, to_pool) in escalate.items()})
    spent = jobs_at_budget(
        {item.job_id: stages[page_id].max_dollars for page_id, (item, _) in escalate.items()},
        {item.job_id: stages[page_id].owner_id for page_id, (item, _) in escalate.items()},
    )
    for page_id, (item, to_pool) in list(escalate.items()):
        stage = stages[page_id]
        why = NOT_OPEN if (stage.owner_id, to_pool) in refused else spent.get(item.job_id)
        if why is not None:
            del escalate[page_id]
            done[page_id] = (item, _reading_kept(item.result, first_pool=stage.pool_key, pool=stage.to_key,
                                                 why={"skipped": why}))  # fmt: skip
    with transaction.atomic():
        stored = _store_done(token=token, items=done)
        moved = _escalate(token=token, items=escalate)
    for pool_id in {escalate[page_id][1] for page_id in moved}:
        transaction.on_commit(lambda pool_id=pool_id: nudge_scaler(pool_id))
    return stored | moved


def _with(answer: PageAnswer, **fields) -> PageAnswer:
    """The answer with fields the control plane adds to what it stores (the cascade's)."""
    return answer.model_copy(update=fields)


def _escalated_result(result: PageAnswer, *, first: str, first_pool: str, pool: str) -> PageAnswer:
    """The second reading of an escalated page, carrying both stages' engines and confidences."""
    cascade = [_stage(_stored_answer(first), first_pool), _stage(result, pool)]
    return _with(result, escalated=True, cascade=cascade)


def _reading_kept(first: PageAnswer, *, first_pool: str, pool: str | None, why: dict) -> PageAnswer:
    """A first reading kept as the page's result: ``pool`` gave none, for ``why`` (an error, or
    the escalation skipped), both stages in its cascade."""
    return _with(first, escalated=False, cascade=[_stage(first, first_pool), {"pool": pool, **why}])


def _stage(result: PageAnswer, pool: str) -> dict:
    return {"pool": pool, "engine": result.engine, "confidence": result.confidence, "seconds": result.seconds}


def result_with_warnings(result: PageAnswer) -> PageAnswer:
    """The result with its ``warnings``: the pod's (orientation unknown, rendered below the DPI
    asked for) and a reading under OCR_WARN_CONFIDENCE_BELOW's, so that a page unusable as it
    stands is never a silent success (issue 40). A page with no text (a blank page) is no warning."""
    confidence, threshold = result.confidence, settings.OCR_WARN_CONFIDENCE_BELOW
    if confidence is None or confidence >= threshold or not result.text.strip():
        return result
    low = f"low confidence: read at {confidence:g}, under {threshold:g}; the text may be wrong"
    return _with(result, warnings=[*result.warnings, low])


_RESULT = [("id", "bigint"), ("attempts", "integer"), ("result", "text"), ("confidence", "double precision"),
           ("pod_id", "bigint"), ("seconds", "double precision"), ("warnings", "integer"),
           ("min_line_confidence", "double precision")]  # fmt: skip


def _values(rows: list[tuple[PageResult, dict, int | None]]) -> tuple[str, list]:
    """The rows of a guarded UPDATE (``v``): each page's attempt, result, confidence, pod and seconds
    (and the pool it moves to, for an escalation), as one parameter where it can (fleetadmin/sqlbatch.py)."""
    extra = rows[0][2] is not None
    values = []
    for item, result, to_pool in rows:
        row = [item.page_id, item.attempt, result_json(result), result.confidence, item.pod_id, item.seconds,
               len(result.warnings), lowest_line_confidence(result)]  # fmt: skip
        values.append([*row, to_pool] if extra else row)
    return rows_table("v", [*_RESULT, ("to_pool", "bigint")] if extra else _RESULT, values)


def _guarded_update(
    *, token: str, rows: list[tuple[PageResult, dict, int | None]], sets: str, params: list, also: str = ""
) -> set[int]:
    """One UPDATE of many pages from their VALUES, each only under the claim ``token`` holds (and
    its attempt, when given); ``sets`` and ``also`` may name ``{table}``, ``also`` the pools'
    ``{pools}`` too. Returns the ids written."""
    values, value_params = _values(rows)
    table = Page._meta.db_table
    pools = Page._meta.get_field("pool").related_model._meta.db_table
    by_id, id_params = _by_id(table, [item.page_id for item, _, _ in rows])
    sql = (
        f"WITH {values} UPDATE {table} SET {sets.format(table=table)} "
        f"FROM v WHERE {by_id} AND {table}.attempts = COALESCE(v.attempts, {table}.attempts)"
        f"{also.format(table=table, pools=pools)} RETURNING {table}.id"
    )  # fmt: skip
    with joined_by_hash(), connection.cursor() as cursor:
        cursor.execute(sql, value_params + params + id_params + [token])
        return {row[0] for row in cursor.fetchall()}


# How a guarded UPDATE finds its pages: by their ids (a list the primary key looks up, and the join to
# the batch's rows, v, which never loops: joined_by_hash), under the claim's token. Not by status too:
# a token is only on a running page (page_claim_only_running), and the status index let the planner,
# whose statistics still saw no page running, read every running page, dead versions included, for
# each flush: 56% of the database's time at 256 pods x 8 lanes (bench/dispatch.py).
def _by_id(table: str, page_ids: list[int]) -> tuple[str, list]:
    """The WHERE of a guarded UPDATE's pages, and its parameters but the token (which comes last).
    The list of ids on PostgreSQL only: SQLite looks each row of the batch up by its key as it is,
    and with the list it read the list's pages and looked each up in the batch (5% more CPU a page
    at 32 pods x 8 lanes)."""
    if connection.vendor != "postgresql":
        return f"{table}.id = v.id AND {table}.claim_token = %s", []
    ids, params = ids_in(page_ids)
    return f"{table}.id {ids} AND {table}.id = v.id AND {table}.claim_token = %s", params


# A page neither escalated already nor in a pool that escalates elsewhere (as Pool.clean allows).
_NO_CASCADE = (
    " AND {table}.escalated_from_id IS NULL AND NOT EXISTS (SELECT 1 FROM {pools} esc WHERE esc.id = {table}.pool_id"
    " AND esc.escalation_pool_id IS NOT NULL AND esc.escalation_pool_id <> esc.id"
    " AND esc.escalation_threshold IS NOT NULL)"
)


def _store_done(*, token: str, items: dict[int, tuple[PageResult, PageAnswer]], also: str = "") -> set[int]:
    if not items:
        return set()
    sets = ("status = %s, result = v.result, confidence = v.confidence, pod_id = v.pod_id, seconds = v.seconds, "
            "warnings = v.warnings, min_line_confidence = v.min_line_confidence, error = '', claim_token = '', "
            "claim_expires_at = NULL, finished_at = %s")  # fmt: skip
    rows = [(item, result_with_warnings(result), None) for item, result in items.values()]
    return _guarded_update(token=token, rows=rows, sets=sets, params=[Page.Status.DONE, timezone.now()], also=also)


def _escalate(*, token: str, items: dict[int, tuple[PageResult, int]]) -> set[int]:
    """Pages read below their pool's threshold wait again in the escalation pool, their first
    reading, pod and seconds kept; attempts start again (the second pool's own). Only a page
    never escalated moves: a page escalates at most once."""
    if not items:
        return set()
    sets = ("status = %s, pool_id = v.to_pool, escalated_from_id = {table}.pool_id, escalated_at = %s, "
            "first_result = v.result, first_confidence = v.confidence, first_pod_id = v.pod_id, "
            "first_seconds = v.seconds, attempts = 0, attempts_given_back = 0, pod_id = NULL, error = '', claim_token = '', "
            "claim_expires_at = NULL")  # fmt: skip
    rows = [(item, item.result, to_pool) for item, to_pool in items.values()]
    return _guarded_update(token=token, rows=rows, sets=sets, params=[Page.Status.PENDING, timezone.now()],
                           also=" AND {table}.escalated_from_id IS NULL")  # fmt: skip


def page_complete(*, page_id: int, token: str, pod_id: int | None, result: dict | PageAnswer) -> bool:
    """Store one page's result once. False if the claim was lost (expired, cancelled, done elsewhere)."""
    page = Page.objects.filter(pk=page_id).values("job_id", "document__position").first()
    if page is None:
        return False
    answer = result if isinstance(result, PageAnswer) else PageAnswer.model_validate(result)
    item = PageResult(page_id, page["job_id"], page["document__position"], pod_id, answer)
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
    preempted = pod_id is not None and Pod.objects.filter(pk=pod_id, preempted_at__isnull=False).exists()
    # Its last attempt spent on a pod the provider had taken back: not the page's failure, it waits.
    spent = page.attempts - page.attempts_given_back >= settings.PAGE_MAX_ATTEMPTS and not preempted
    if (final or spent) and page.escalated_from_id:
        claim.update(**first_reading_kept(page, error), pod_id=pod_id)
        return "failed"
    if final or spent:
        claim.update(
            status=Page.Status.FAILED, error=error[:2000], pod_id=pod_id, claim_token="",
            claim_expires_at=None, finished_at=timezone.now(),
        )  # fmt: skip
        return "failed"
    claim.update(
        status=Page.Status.PENDING, error=error[:2000], claim_token="", claim_expires_at=None, failed_on_pod_id=pod_id
    )
    if preempted or Pod.objects.filter(pk=pod_id, preempted_at__isnull=False).exists():
        # Preempted before this failure was stored: given back now (marked first: no race with it).
        _give_back_attempts(Page.objects.filter(pk=page_id), pod_id=pod_id)
    return "retry"


def _attempts_spent() -> Q:
    """A page's attempts are spent: those given back (preemptions) do not count."""
    return Q(attempts__gte=F("attempts_given_back") + settings.PAGE_MAX_ATTEMPTS)


def pages_requeue_preempted(*, pod_id: int, at=None) -> int:
    """The provider took an interruptible pod back (at ``at``): the attempts it cost its pages are
    given back, each once. Those running on it wait again; those whose last attempt failed on it
    (``failed_on_pod``) get it back (``_give_back_attempts``); those whose last attempt failed
    there after ``at``, and so failed for good, wait again while their job is open (a page is not
    lost to a preemption). A late answer from the pod finds no claim and is not stored. Returns
    the pages given back."""
    running = Page.objects.filter(pod_id=pod_id, status=Page.Status.RUNNING).update(
        status=Page.Status.PENDING, claim_token="", claim_expires_at=None, attempts=F("attempts") - 1
    )
    revived = 0
    if at is not None:
        lost_to_it = Page.objects.filter(pod_id=pod_id, status=Page.Status.FAILED, finished_at__gte=at, attempts__gt=0)
        with transaction.atomic():  # under the jobs' locks: none of them ends meanwhile
            jobs = Job.objects.select_for_update().filter(pk__in=lost_to_it.values("job_id"))
            open_jobs = list(jobs.exclude(status__in=Job.FINISHED).values_list("pk", flat=True))
            revived = lost_to_it.filter(job_id__in=open_jobs).update(
                status=Page.Status.PENDING, attempts=F("attempts") - 1, pod=None, finished_at=None, failed_on_pod=None
            )
    return running + revived + _give_back_attempts(Page.objects.all(), pod_id=pod_id)


def _give_back_attempts(pages, *, pod_id: int) -> int:
    """The failed attempts on ``pod_id`` of ``pages``, given back once (the mark goes in the same UPDATE): in
    ``attempts`` if the page waits; else in ``attempts_given_back`` (a newer claim is named by ``attempts``)."""
    failed_there = pages.filter(failed_on_pod_id=pod_id)
    waiting = failed_there.filter(status=Page.Status.PENDING, attempts__gt=0).update(
        attempts=F("attempts") - 1, failed_on_pod=None
    )
    return waiting + failed_there.update(attempts_given_back=F("attempts_given_back") + 1, failed_on_pod=None)


def first_reading_kept(page: Page, error: str, *, key: str = "error") -> dict:
    """The fields of an escalated page whose second pool gave no reading: done with its first
    one, the escalation's error (or, ``key="skipped"``, why it was not read) in the result's
    cascade (the page is not lost to the cascade)."""
    first = _stored_answer(page.first_result)
    kept = result_with_warnings(
        _reading_kept(first, first_pool=page.escalated_from.key, pool=page.pool.key, why={key: error[:2000]})
    )
    return {
        "status": Page.Status.DONE, "result": result_json(kept), "warnings": len(kept.warnings),
        "min_line_confidence": lowest_line_confidence(kept),
        "confidence": page.first_confidence, "seconds": None, "error": "", "claim_token": "",
        "claim_expires_at": None, "finished_at": timezone.now(),
    }  # fmt: skip


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
