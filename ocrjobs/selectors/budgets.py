"""Users' daily budgets, as submissions, retries and the scaler read them: each owner's dollars per
day (``accounts.Budget``, else USER_DOLLARS_PER_DAY for users who are not staff), and what the
owner's jobs of the window have cost: those that started in the last 24 hours (submitted or
retried) or still run.

A day is spent when that cost reaches the budget: a submission or a retry is then refused, and
the scaler boots no pod for any of the owner's pages (``jobs_past_owners_day``), whatever each
job's own budget. So several jobs of one user run at once within one day's budget, and what
they cost together stops growing past it but for the pods already up.
"""

from __future__ import annotations

from collections.abc import Iterable
from decimal import Decimal

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db.models import Q, Sum
from django.utils import timezone

from accounts.models import Budget
from ocrjobs.models import Job, Page
from pods.models import SpendEntry
from pods.spend import live_shares

WINDOW = timezone.timedelta(hours=24)


def daily_budgets(owner_ids: Iterable[int]) -> dict[int, Decimal]:
    """The owners' dollars per day, for the owners who have a limit (the rest are left out)."""
    owner_ids = set(owner_ids)
    if not owner_ids:
        return {}
    rows = dict(Budget.objects.filter(user_id__in=owner_ids).values_list("user_id", "dollars_per_day"))
    budgets = {owner: dollars for owner, dollars in rows.items() if dollars is not None}
    default = settings.USER_DOLLARS_PER_DAY
    if default is not None:
        others = get_user_model().objects.filter(pk__in=owner_ids - rows.keys(), is_staff=False)
        budgets.update(dict.fromkeys(others.values_list("pk", flat=True), default))
    return budgets


def window_jobs(owner_ids: Iterable[int]) -> Q:
    """The owners' jobs that count against their day: started in the window, or still running."""
    return Q(owner_id__in=list(owner_ids)) & (Q(started_at__gte=timezone.now() - WINDOW) | ~Q(status__in=Job.FINISHED))


def days_spent(owner_ids: Iterable[int]) -> dict[int, Decimal]:
    """What each owner's jobs of the window have cost so far: the entries of ended pods summed by
    owner in the database, and the live pods' shares of the jobs they served. The window's jobs
    stay a subquery, so a submission's check costs the same however many jobs its owner ran
    today (reading each of them cost an API user of one document a job more with every job)."""
    owner_ids = list(owner_ids)
    spent: dict[int, Decimal] = dict.fromkeys(owner_ids, Decimal(0))
    window = Job.objects.filter(window_jobs(owner_ids)).values("pk")
    entries = SpendEntry.objects.filter(job_id__in=window).values("job__owner_id").annotate(dollars=Sum("dollars"))
    for owner, dollars in entries.values_list("job__owner_id", "dollars"):
        spent[owner] += dollars
    for owner, dollars in live_shares(window, per="job__owner_id").items():
        spent[owner] += dollars
    return spent


def jobs_past_owners_day(pool_id: int) -> list[int]:
    """Unfinished jobs with pages waiting in the pool (their own or escalated there) whose owner's
    day is spent: the scaler boots no pod for them."""
    waiting = Page.objects.waiting().filter(pool_id=pool_id).values("job_id")
    jobs = dict(
        Job.objects.filter(pk__in=waiting, owner__isnull=False).exclude(status__in=Job.FINISHED)
        .values_list("pk", "owner_id")
    )  # fmt: skip
    budgets = daily_budgets(set(jobs.values()))
    if not budgets:
        return []
    spent = days_spent(budgets)
    return [pk for pk, owner in jobs.items() if owner in budgets and spent[owner] >= budgets[owner]]
