"""What a user's jobs may still cost: their daily budget less what their jobs of the window (started
in the last 24 hours, submitted or retried, or still running) have cost (``ocrjobs.selectors.budgets``).

A submission within budget gets a job budget (``max_dollars``) of at most what is left; one with
nothing left is refused (429). A retry is checked the same way (a retried job runs again: its cap
becomes what it cost plus what is left). Jobs running at once share the day: a job is not held
to have spent its cap before it has, and the scaler boots no pod for any of the owner's pages once
their jobs together have spent the day (``jobs_past_owners_day``). Submissions and retries of one
user are checked one at a time (the user's row is locked in their transaction on PostgreSQL;
SQLite has one writer).
"""

from __future__ import annotations

from dataclasses import replace
from decimal import Decimal

from django.contrib.auth import get_user_model
from django.db import connection

from fleetadmin.errors import QuotaExceeded
from ocrjobs.models import Job
from ocrjobs.selectors.budgets import days_spent, users_daily_budget
from ocrjobs.services.schedule import Schedule
from pods.spend import jobs_spend


def daily_budget(owner) -> Decimal | None:
    """The owner's dollars per day, or None for no limit (the command line, staff by default)."""
    if owner is None or not owner.is_authenticated:
        return None
    return users_daily_budget(owner)


def budget_left(owner, *, lock: bool = False) -> tuple[Decimal, Decimal] | None:
    """(the daily budget, what is left of it now), or None when the owner has no limit.
    ``lock``: inside a transaction, hold the owner's row so that their submissions take turns."""
    budget = daily_budget(owner)
    if budget is None:
        return None
    if lock and connection.features.has_select_for_update:  # SQLite: one writer, no row locks
        get_user_model().objects.select_for_update().filter(pk=owner.pk).first()
    return budget, budget - days_spent([owner.pk])[owner.pk]


def schedule_within_budget(owner, schedule: Schedule, *, lock: bool = False) -> Schedule:
    """The schedule with a job budget of at most what is left of the owner's day; QuotaExceeded
    when nothing is left."""
    remaining = _left_or_refuse(owner, lock=lock, doing="submit")
    if remaining is not None and (schedule.max_dollars is None or schedule.max_dollars > remaining):
        return replace(schedule, max_dollars=remaining)
    return schedule


def retry_within_budget(job: Job) -> Decimal | None:
    """A retried job's budget (``max_dollars``): what it has cost plus what is left of its owner's
    day, within its own; None when its owner has no limit (nor the job). QuotaExceeded when nothing
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
        raise QuotaExceeded(
            f"your daily budget of ${budget} is spent by your jobs of the last 24 hours: {doing} again once it "
            f"frees up, or ask for a larger budget",
        )
    return remaining
