"""A job's budget, deadline and priority: one check for the API, the form and the command line."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal, InvalidOperation

from django.utils import timezone

from fleetadmin.errors import Invalid
from ocrjobs.models import Job

MAX_DEADLINE_DAYS = 30
MAX_JOB_DOLLARS = Decimal("100000")


@dataclass(frozen=True)
class Schedule:
    """A job's budget and urgency, checked: what the API, the form and the CLI all pass on."""

    max_dollars: Decimal | None = None
    deadline: datetime | None = None
    priority: str = Job.Priority.BALANCED


def resolve_schedule(
    *, max_dollars: object = None, deadline: object = None, priority: object = None, now: datetime | None = None
) -> Schedule:
    """Check a job's budget (dollars, more than 0, cents at most), its deadline (ISO 8601 with a
    time zone, in the future, within 30 days) and its priority (fastest, balanced, cheapest);
    a deadline and a priority other than balanced exclude each other. Strings are parsed (the
    form and multipart send strings); anything else malformed is refused (Invalid, its field named)."""
    dollars = None
    if max_dollars not in (None, ""):
        if isinstance(max_dollars, bool):
            raise Invalid("max_dollars must be a number of dollars, e.g. 12.50", field="max_dollars")
        try:
            dollars = Decimal(str(max_dollars).strip())
        except InvalidOperation:
            raise Invalid(
                f"max_dollars must be a number of dollars, e.g. 12.50, not {str(max_dollars)[:20]!r}",
                field="max_dollars",
            ) from None
        if not dollars.is_finite() or dollars <= 0 or dollars > MAX_JOB_DOLLARS:
            raise Invalid(f"max_dollars must be more than 0 and at most {MAX_JOB_DOLLARS}", field="max_dollars")
        if dollars != dollars.quantize(Decimal("0.01")):
            raise Invalid("max_dollars has at most two decimal places (cents)", field="max_dollars")
    when = None
    if deadline not in (None, ""):
        if isinstance(deadline, datetime):
            when = deadline
        else:
            try:
                when = datetime.fromisoformat(str(deadline).strip())
            except ValueError:
                raise Invalid(
                    f"deadline must be an ISO 8601 time, e.g. 2026-12-01T14:00:00Z, not {str(deadline)[:40]!r}",
                    field="deadline",
                ) from None
        if when.tzinfo is None:
            raise Invalid("deadline needs a time zone, e.g. 2026-12-01T14:00:00Z or +01:00", field="deadline")
        now = now or timezone.now()
        if when <= now:
            raise Invalid(f"deadline {when.isoformat()} is in the past", field="deadline")
        if when > now + timedelta(days=MAX_DEADLINE_DAYS):
            raise Invalid(f"deadline is more than {MAX_DEADLINE_DAYS} days away", field="deadline")
    chosen = Job.Priority.BALANCED if priority in (None, "") else priority
    if chosen not in Job.Priority.values:
        raise Invalid(f"priority must be fastest, balanced or cheapest, not {str(priority)[:20]!r}", field="priority")
    if when is not None and chosen != Job.Priority.BALANCED:
        raise Invalid("give a deadline or a priority, not both: a deadline sizes the pool to meet it", field="priority")
    return Schedule(max_dollars=dollars, deadline=when, priority=chosen)
