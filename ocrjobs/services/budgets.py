"""What a user's jobs may still cost: their daily budget (``accounts.Budget``, else
USER_DOLLARS_PER_DAY for users who are not staff) less what their jobs that started in the last
24 hours (submitted or retried), or still run, have cost, or may still cost up to their own
budgets while they run.

A submission within budget gets a job budget (``max_dollars``) of at most what is left, so the
scaler's per-job cap (no pod boots for a job's pages past its budget) keeps the user's day within
theirs; one with nothing left is refused. A retry is checked the same way (a retried job runs
again: its cap becomes what it cost plus what is left). Submissions and retries of one user are
checked one at a time (the user's row is locked in their transaction on PostgreSQL; SQLite has
one writer).
"""

from __future__ import annotations

from dataclasses import replace
from decimal import Decimal

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db.models import Q
from django.utils import timezone

from accounts.models import Budget
from fleetadmin.api import ApiError
from ocrjobs.models import Job
from ocrjobs.services.schedule import Schedule
from pods.spend import jobs_spend

WINDOW = timezone.timedelta(hours=24)


def daily_budget(owner) -> Decimal | None:
    """The owner's dollars per day, or None for no limit (the command line, staff by default)."""
    if owner is None or not owner.is_authenticated:
        return None
    budget = Budget.objects.filter(user=owner).first()
    if budget is not None:
        return budget.dollars_per_day
    return None if owner.is_staff else settings.USER_DOLLARS_PER_DAY


def budget_left(owner, *, lock: bool = False) -> tuple[Decimal, Decimal] | None:
    """(the daily budget, what is left of it now), or None when the owner has no limit.
    ``lock``: inside a transaction, hold the owner's row so that their submissions take turns."""
    budget = daily_budget(owner)
    if budget is None:
        return None
    if lock:
        get_user_model().objects.select_for_update().filter(pk=owner.pk).first()
    # A job counts from its last start (a retry, a day later, spends again) and while it runs.
    window = Q(started_at__gte=timezone.now() - WINDOW) | ~Q(status__in=Job.FINISHED)
    jobs = list(Job.objects.filter(window, owner=owner).values_list("pk", "status", "max_dollars"))
    spent = jobs_spend([pk for pk, _, _ in jobs])
    committed = sum(
        (
            max(spent[pk], cap) if status not in Job.FINISHED and cap is not None else spent[pk]
            for pk, status, cap in jobs
        ),
        Decimal(0),
    )
    return budget, budget - committed


def schedule_within_budget(owner, schedule: Schedule, *, lock: bool = False) -> Schedule:
    """The schedule with a job budget of at most what is left of the owner's day; ApiError 429
    when nothing is left."""
    remaining = _left_or_refuse(owner, lock=lock, doing="submit")
    if remaining is not None and (schedule.max_dollars is None or schedule.max_dollars > remaining):
        return replace(schedule, max_dollars=remaining)
    return schedule


def retry_within_budget(job: Job) -> Decimal | None:
    """A retried job's budget (``max_dollars``): what it has cost plus what is left of its owner's
    day, within its own; None when its owner has no limit (nor the job). ApiError 429 when nothing
    is left. Inside the retry's transaction: the owner's row is locked as a submission's."""
    remaining = _left_or_refuse(job.owner, lock=True, doing="retry")
    if remaining is None:
        return job.max_dollars
    # budget_left counted the job as finished, at what it cost: retried, it may cost that plus the rest.
    allowed = jobs_spend([job.pk])[job.pk] + remaining
    return allowed if job.max_dollars is None else min(job.max_dollars, allowed)


def _left_or_refuse(owner, *, lock: bool, doing: str) -> Decimal | None:
    left = budget_left(owner, lock=lock)
    if left is None:
        return None
    budget, remaining = left
    remaining = remaining.quantize(Decimal("0.01"))
    if remaining < Decimal("0.01"):
        raise ApiError(
            f"your daily budget of ${budget} is used by your jobs of the last 24 hours (what they cost, or may cost "
            f"while they run): {doing} again once it frees up, or ask for a larger budget",
            429,
        )
    return remaining
