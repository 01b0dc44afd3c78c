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
from django.db import connection
from django.db.models import Q
from django.utils import timezone

from accounts.models import Budget
from ocrjobs.models import Job, Page
from pods.models import Pod, SpendEntry
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


def users_daily_budget(user) -> Decimal | None:
    """``daily_budgets`` of one user whose row is read already (its ``is_staff``): one statement."""
    rows = list(Budget.objects.filter(user_id=user.pk).values_list("dollars_per_day", flat=True)[:1])
    if rows:
        return rows[0]
    return None if user.is_staff else settings.USER_DOLLARS_PER_DAY


def window_jobs(owner_ids: Iterable[int]) -> Q:
    """The owners' jobs that count against their day: started in the window, or still running."""
    return Q(owner_id__in=list(owner_ids)) & (Q(started_at__gte=timezone.now() - WINDOW) | ~Q(status__in=Job.FINISHED))


def days_spent(owner_ids: Iterable[int]) -> dict[int, Decimal]:
    """What each owner's jobs of the window have cost so far: the entries of ended pods, and the
    live pods' shares of the jobs they served (``pods.spend.live_shares``: the seconds their done
    pages held a lane, a first reading of an escalated page too), summed by owner in the
    database. The window's jobs stay in the statement, so a submission's check costs the same
    however many jobs its owner ran today (reading each of them cost an API user of one document
    a job more with every job).

    One statement of SQL of our own (``_day_spent_sql``), not three querysets: every submission
    and retry runs it, and the ORM took 5 of its 6.6 ms building the three statements (2,280
    pages done that day on 8 pods, this machine); its figures are the querysets' to the micro-
    dollar (tests/ocrjobs/test_spend_limits.py)."""
    owner_ids = list(owner_ids)
    spent: dict[int, Decimal] = dict.fromkeys(owner_ids, Decimal(0))
    if not owner_ids:
        return spent
    busy: dict[int, dict[int, tuple]] = {}
    dollars_field = SpendEntry._meta.get_field("dollars")
    price_field = Pod._meta.get_field("cost_per_hr")
    with connection.cursor() as cursor:
        cursor.execute(_day_spent_sql(len(owner_ids)), _day_spent_params(owner_ids))
        for owner, pod_id, state, cost_per_hr, lanes, amount in cursor.fetchall():
            if pod_id is None:  # the ended pods' entries
                spent[owner] += _decimal(dollars_field, amount)
            else:  # seconds on a live pod, from pages and first readings: summed before pricing
                seconds = busy.setdefault(owner, {}).get(pod_id, (0.0,))[0] + amount
                busy[owner][pod_id] = (seconds, state, _decimal(price_field, cost_per_hr), lanes)
    for owner, dollars in live_shares([], busy_on_pods=busy).items():
        spent[owner] += dollars
    return spent


def _day_spent_sql(owners: int) -> str:
    page, job, pod, entry = (model._meta.db_table for model in (Page, Job, Pod, SpendEntry))
    return f"""
WITH w AS (
  SELECT id, owner_id FROM {job}
  WHERE owner_id IN ({", ".join(["%s"] * owners)})
    AND (started_at >= %s OR status NOT IN ({", ".join(["%s"] * len(Job.FINISHED))}))
), live AS (
  SELECT id, state, cost_per_hr, lanes FROM {pod}
  WHERE state IN ({", ".join(["%s"] * len(Pod.ALIVE_STATES))}) AND cost_per_hr > 0 AND lanes > 0
)
SELECT w.owner_id, NULL, NULL, NULL, NULL, SUM(e.dollars) FROM {entry} e JOIN w ON e.job_id = w.id
GROUP BY w.owner_id
UNION ALL
SELECT w.owner_id, live.id, live.state, live.cost_per_hr, live.lanes, SUM(p.seconds) FROM {page} p
JOIN w ON p.job_id = w.id JOIN live ON p.pod_id = live.id
WHERE p.status = %s AND p.seconds IS NOT NULL
GROUP BY w.owner_id, live.id, live.state, live.cost_per_hr, live.lanes
UNION ALL
SELECT w.owner_id, live.id, live.state, live.cost_per_hr, live.lanes, SUM(p.first_seconds) FROM {page} p
JOIN w ON p.job_id = w.id JOIN live ON p.first_pod_id = live.id
WHERE p.first_seconds IS NOT NULL
GROUP BY w.owner_id, live.id, live.state, live.cost_per_hr, live.lanes"""


def _day_spent_params(owner_ids: list[int]) -> list:
    since = connection.ops.adapt_datetimefield_value(timezone.now() - WINDOW)
    return [*owner_ids, since, *Job.FINISHED, *Pod.ALIVE_STATES, Page.Status.DONE]


def _decimal(field, value) -> Decimal:
    """A DecimalField's value as the ORM reads it (SQLite sums and reads decimals as floats)."""
    if isinstance(value, Decimal):
        return value
    return field.to_python(value).quantize(Decimal(1).scaleb(-field.decimal_places))


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
