"""The cascade and a job's budget (issue 26): a page is escalated only while its job's budget
lasts, and an escalated page waiting in the escalation pool keeps its first reading once the
budget is spent (the scaler boots no pod for it there, as for any page of a job past its budget).
Nor is a page escalated into a pool its job's owner may not submit to (issue 38): moving work
between pools checks the same rights as a submission.
"""

from __future__ import annotations

from decimal import Decimal

from django.db import transaction

from ocrjobs.models import Page
from ocrjobs.selectors.budgets import daily_budgets, days_spent
from ocrjobs.services.jobs import job_refresh
from ocrjobs.services.pages import first_reading_kept
from pods.models import Pool
from pods.spend import jobs_spend

NOT_OPEN = "the escalation pool is not open to the job's owner"
OWNERS_DAY = "the daily budget of the job's owner is spent by their jobs of the last 24 hours"


def jobs_at_budget(
    max_dollars: dict[int, Decimal | None], owners: dict[int, int | None] | None = None
) -> dict[int, str]:
    """Of the jobs with pages to escalate ({job id: its budget}; ``owners``: {job id: its owner's
    id}), those whose budget, or whose owner's day, is spent, with why: their pages keep the first
    reading. The scaler's rule for every page (no pod for a job past its budget or its owner's
    day), held at the escalation, where a page would otherwise start new spend."""
    budgets = {job_id: dollars for job_id, dollars in max_dollars.items() if dollars is not None}
    spent = jobs_spend(budgets) if budgets else {}
    at = {job_id: budget_spent(budgets[job_id], spent[job_id]) for job_id in budgets
          if spent[job_id] >= budgets[job_id]}  # fmt: skip
    owners = {job_id: owner for job_id, owner in (owners or {}).items() if owner is not None and job_id not in at}
    days = daily_budgets(set(owners.values()))
    if days:
        days_of = days_spent(days)
        at.update({job_id: OWNERS_DAY for job_id, owner in owners.items()
                   if owner in days and days_of[owner] >= days[owner]})  # fmt: skip
    return at


def escalations_refused(moves: set[tuple[int | None, int]]) -> set[tuple[int | None, int]]:
    """Of the (job owner's id, escalation pool id) that pages would move by, those the owner may
    not submit to (``Pool.objects.open_to``): those pages keep their first reading. A job without
    an owner (the command line: whoever runs the deployment) may use every pool. A query per
    owner, for the pages of a batch that escalate only."""
    from django.contrib.auth import get_user_model

    owners = get_user_model().objects.in_bulk({owner_id for owner_id, _ in moves if owner_id is not None})
    pools = {pool_id for _, pool_id in moves}
    open_to = {
        owner_id: set(Pool.objects.open_to(owner).filter(pk__in=pools).values_list("pk", flat=True))
        for owner_id, owner in owners.items()
    }
    return {(owner_id, pool_id) for owner_id, pool_id in moves
            if owner_id is not None and pool_id not in open_to.get(owner_id, set())}  # fmt: skip


def budget_spent(max_dollars: Decimal, spent: Decimal) -> str:
    return f"the job's budget of ${max_dollars} is spent (${spent:.4f})"


def pages_escalated_over_budget(*, pool_id: int, job_ids: list[int], limit: int = 1000) -> int:
    """Escalated pages waiting in ``pool_id`` whose jobs' budgets are spent (the scaler's capped
    jobs) are done with their first reading, the budget named in their cascade: no pod boots for
    them, and they have a reading. At most ``limit`` a call (one guarded UPDATE each, as each
    row's own result is rewritten); the scaler's next tick takes the rest. Returns the pages kept."""
    if not job_ids:
        return 0
    waiting = Page.objects.waiting().filter(pool_id=pool_id, job_id__in=job_ids).exclude(escalated_from=None)
    pages = list(waiting.select_related("escalated_from", "pool", "job").order_by("id")[:limit])
    spent = jobs_spend({page.job_id for page in pages}) if pages else {}
    kept, jobs = 0, set()
    with transaction.atomic():
        for page in pages:
            own = page.job.max_dollars
            why = budget_spent(own, spent[page.job_id]) if own is not None and spent[page.job_id] >= own else OWNERS_DAY
            claim = Page.objects.filter(
                pk=page.pk, status=page.status, attempts=page.attempts, claim_token=page.claim_token
            )
            if claim.update(**first_reading_kept(page, why, key="skipped")):
                kept += 1
                jobs.add(page.job_id)
        for job_id in jobs:
            transaction.on_commit(lambda job_id=job_id: job_refresh(job_id=job_id))
    return kept
