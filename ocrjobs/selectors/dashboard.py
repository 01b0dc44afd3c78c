"""The dashboard's reads: its jobs (bounded walks down indexes, however many jobs were ever
made), their progress and rate, pages in flight on each pod, and pages done by minute for
the charts. They run every second, so each is a fixed number of queries.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal

from django.db import connection
from django.db.models import (
    BigIntegerField,
    Case,
    Count,
    DateTimeField,
    Expression,
    F,
    Func,
    OuterRef,
    Q,
    Subquery,
    Sum,
    Value,
    When,
)
from django.db.models.expressions import RawSQL
from django.db.models.functions import Coalesce
from django.utils import timezone

from fleetadmin.sqlbatch import IdsOf
from ocrjobs.models import Document, Job, Page
from pods.models import SpendEntry

DASHBOARD_ACTIVE_JOBS = 20
DASHBOARD_FINISHED_JOBS = 10
JOB_RATE_WINDOW_SECONDS = 60


def jobs_for_dashboard(*, owner_ids: list[int] | None = None) -> list[Job]:
    """The most recent active jobs and the most recently finished ones, newest first, each with
    ``expected_pages`` (what its documents hold) and ``ended_pods_dollars`` (its spend entries).

    ``owner_ids=None``: everybody's (staff). Otherwise the same limits apply to
    each owner separately, in one query whatever the number of owners.
    """
    if owner_ids is None:
        return _trimmed(_newest_jobs(), by_owner=False)
    return _trimmed(_owners_jobs(owner_ids=list(owner_ids)), by_owner=True) if owner_ids else []


def job_rows_read(*, also: tuple[str, ...] = ()):
    # What the dashboard's rows show, no more: its reads run every second, and each column is a
    # conversion per row (datetimes are parsed in Python on SQLite). ``also``: the job list's more.
    shown = ("owner_id", "pool_id", "status", "created_at", "owner__username", "pool__key", *also)
    jobs = Job.objects.select_related("pool", "owner").only(*shown)
    # the pages its documents hold, for job_progress, and the dollars of its spend entries, for
    # pods.spend.jobs_spend: two reads fewer each second
    pages = Document.objects.filter(job=OuterRef("pk")).order_by().values("job").annotate(n=Sum("page_count"))
    entries = SpendEntry.objects.filter(job=OuterRef("pk")).order_by().values("job").annotate(d=Sum("dollars"))
    dollars = SpendEntry._meta.get_field("dollars")
    return jobs.annotate(
        expected_pages=Coalesce(Subquery(pages.values("n")), 0),
        failed_documents=failed_documents_of(OuterRef("pk")),
        ended_pods_dollars=Coalesce(Subquery(entries.values("d"), output_field=dollars), Decimal(0), output_field=dollars),
    )  # fmt: skip


def failed_documents_of(job):
    """How many of ``job``'s documents failed (an expression: a subquery on the job's row), so that
    a progress row says "1 document failed" without a read of its own."""
    failed = Document.objects.filter(job=job, status=Document.Status.FAILED).order_by().values("job")
    return Coalesce(Subquery(failed.annotate(n=Count("id")).values("n")), 0)


_NEWEST_FIRST = [F("created_at").desc(), F("id").desc()]
_LIVE_STATUSES = (Job.Status.QUEUED, Job.Status.RUNNING)
_LIVE = Q(status__in=_LIVE_STATUSES)


def _newest(jobs) -> list:
    """The newest active jobs and the newest finished ones of ``jobs``, as short walks down
    indexes on (…, created_at, id), however many jobs were ever made: the finished ones down the
    jobs by age (only active ones in the way), the active ones down each live status's own. (One
    walk for both live statuses passes every finished job when fewer than 20 are active: 2.5 ms
    on SQLite for an owner of 10,000 finished jobs, 0.7 this way.) Up to twice
    DASHBOARD_ACTIVE_JOBS active ones: _trimmed keeps the newest."""
    active = [jobs.filter(status=status).order_by(*_NEWEST_FIRST)[:DASHBOARD_ACTIVE_JOBS] for status in _LIVE_STATUSES]
    return [*active, jobs.exclude(_LIVE).order_by(*_NEWEST_FIRST)[:DASHBOARD_FINISHED_JOBS]]


def _newest_rows(ids: IdsOf):
    """The rows of ``ids``, active first, newest first: the walks and the rows in one statement
    (IdsOf), a round trip and a plan fewer than a read for each walk."""
    active = Case(When(_LIVE, then=Value(1)), default=Value(0))
    return job_rows_read().filter(pk__in=ids).annotate(is_active=active).order_by("-is_active", *_NEWEST_FIRST)


def _trimmed(jobs: list[Job], *, by_owner: bool) -> list[Job]:
    """The first DASHBOARD_ACTIVE_JOBS active jobs of ``jobs`` (each owner's, ``by_owner``), and
    every finished one (each walk took no more than DASHBOARD_FINISHED_JOBS)."""
    shown: dict[int | None, int] = defaultdict(int)
    kept = []
    for job in jobs:
        if job.is_active:
            key = job.owner_id if by_owner else None
            shown[key] += 1
            if shown[key] > DASHBOARD_ACTIVE_JOBS:
                continue
        kept.append(job)
    return kept


def _newest_jobs():
    return _newest_rows(IdsOf(*_newest(Job.objects.all())))


class _OwnersNewestIds(Expression):
    """The ids of each owner's newest jobs (_newest's walks, each owner's own): on SQLite the
    walks of every owner joined with UNION ALL (IdsOf); on PostgreSQL each walk once, LATERAL
    over the owners, since planning a UNION ALL of three walks an owner grew faster than the
    owners did (10 owners 2.7 ms, 50 owners 33 ms) where the LATERAL plan stays one size."""

    output_field = BigIntegerField()

    def __init__(self, owner_ids: list[int]) -> None:
        super().__init__()
        self.owner_ids = list(owner_ids)

    def as_sql(self, compiler, connection):
        walks = (walk for owner_id in self.owner_ids for walk in _newest(Job.objects.filter(owner_id=owner_id)))
        return IdsOf(*walks).as_sql(compiler, connection)

    def as_postgresql(self, compiler, connection):
        owners = ", ".join(["(%s)"] * len(self.owner_ids))
        sqls, params = [], []
        for walk in _newest(Job.objects.filter(owner_id=RawSQL("owners.id", ()))):
            sql, walk_params = walk.values("pk").query.get_compiler(connection=connection).as_sql()
            sqls.append(f"SELECT walk.pk FROM (VALUES {owners}) AS owners (id) CROSS JOIN LATERAL ({sql}) walk")
            params += [*self.owner_ids, *walk_params]
        return "(" + " UNION ALL ".join(sqls) + ")", params


def _owners_jobs(owner_ids):
    # Each owner's walks down the (owner, status, created_at, id) and (owner, created_at, id)
    # indexes. (Ranking each owner's jobs with ROW_NUMBER read every job the owners ever made,
    # every second: 250 ms on PostgreSQL for two owners of 10,000 jobs each, 37 on SQLite.)
    return _newest_rows(_OwnersNewestIds(owner_ids))


@dataclass
class JobProgress:
    job: Job
    expected: int  # pages in the job's documents (known before splitting ends)
    done: int
    failed: int
    cancelled: int
    running: int
    pending: int
    pages_per_s: float
    # What the job has cost so far, as pods.spend.jobs_spend counts it: the caller fills it in.
    cost: Decimal = Decimal(0)
    # {pod id: (seconds its done pages held that pod, the pod's state, $/h, lanes)}
    busy_on_pods: dict[int, tuple] = field(default_factory=dict)
    failed_documents: int = 0  # documents that could not be split or fetched: no pages of theirs count
    # Whether a page of the job is out at a pod the dashboard's fleet snapshot shows (None: not asked).
    reading: bool | None = None

    @property
    def ended(self) -> int:
        return self.done + self.failed + self.cancelled

    @property
    def percent(self) -> int:
        return min(100, int(100 * self.ended / self.expected)) if self.expected else 0

    @property
    def segments(self) -> dict[str, int]:
        """The bar's widths in percent: pages done, failed and cancelled, each its own segment, so
        that a cancelled job of 0 pages done shows no done bar. Each is rounded down and the three
        never add up to more than 100."""
        widths, left = {}, 100
        for name in ("done", "failed", "cancelled"):
            width = min(left, int(100 * getattr(self, name) / self.expected)) if self.expected else 0
            widths[name] = width
            left -= width
        return widths

    @property
    def eta_s(self) -> float | None:
        """At the last minute's rate; on the dashboard, none while no page is out at a pod (a job
        whose pool had no pod left said "ETA 54 s" from the pages its released pods had read)."""
        remaining = self.expected - self.ended
        if self.job.is_finished or remaining <= 0 or self.pages_per_s <= 0 or self.reading is False:
            return None
        return remaining / self.pages_per_s


def job_progress(jobs: list[Job], *, now: datetime | None = None, serving: set[int] | None = None) -> list[JobProgress]:
    """Progress, rate and ETA of each job, in three queries whatever the number of jobs (one for
    jobs_for_dashboard's and the job list's, which carry the pages their documents hold and their
    failed documents); with the seconds its done pages held each pod and that pod's state and
    price (``busy_on_pods``), so that what it cost so far needs no read of the pages of its own
    (pods.spend.jobs_spend). ``serving``: the pods the dashboard's fleet snapshot shows; a page
    counts as running only while it is out at one of them, else as waiting (one a dispatcher
    holds for a lane, one whose pod was released a moment ago)."""
    now = now or timezone.now()
    ids = [job.pk for job in jobs]
    if not ids:
        return []
    expected = _expected_pages(jobs, ids)
    failed_documents = _failed_documents(jobs, ids)
    rows = _pages_of_jobs(job_ids=ids, since=now - timedelta(seconds=JOB_RATE_WINDOW_SECONDS))
    counts, busy_on_pods = _page_tallies(rows, serving)
    return [
        JobProgress(
            job=job,
            expected=expected.get(job.pk) or 0,
            done=counts[job.pk][Page.Status.DONE],
            failed=counts[job.pk][Page.Status.FAILED],
            cancelled=counts[job.pk][Page.Status.CANCELLED],
            running=counts[job.pk][Page.Status.RUNNING],
            pending=counts[job.pk][Page.Status.PENDING],
            pages_per_s=round(counts[job.pk]["recent"] / JOB_RATE_WINDOW_SECONDS, 2),
            busy_on_pods=busy_on_pods[job.pk],
            failed_documents=failed_documents.get(job.pk, 0),
            reading=None if serving is None else counts[job.pk][Page.Status.RUNNING] > 0,
        )
        for job in jobs
    ]


def _expected_pages(jobs: list[Job], ids: list[int]) -> dict[int, int]:
    """The pages each job's documents hold: as jobs_for_dashboard read them, or one query."""
    if all(hasattr(job, "expected_pages") for job in jobs):
        return {job.pk: job.expected_pages for job in jobs}
    return dict(
        Document.objects.filter(job_id__in=ids)
        .values("job_id")
        .annotate(n=Sum("page_count"))
        .values_list("job_id", "n")
    )


def _failed_documents(jobs: list[Job], ids: list[int]) -> dict[int, int]:
    """Each job's failed documents: as jobs_for_dashboard read them, or one query."""
    if all(hasattr(job, "failed_documents") for job in jobs):
        return {job.pk: job.failed_documents for job in jobs}
    return dict(
        Document.objects.filter(job_id__in=ids, status=Document.Status.FAILED)
        .values("job_id")
        .annotate(n=Count("id"))
        .values_list("job_id", "n")
    )


def _page_tallies(rows, serving: set[int] | None) -> tuple[dict, dict]:
    """From ``_pages_of_jobs``' rows: each job's pages by status (``recent``: done within the
    rate window) and, for its done pages, the seconds they held each pod with that pod's state,
    price and lanes. A page out at a pod not ``serving`` counts as waiting."""
    counts: dict[int, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    busy_on_pods: dict[int, dict[int, tuple]] = defaultdict(dict)
    for job_id, status, pod_id, state, cost_per_hr, lanes, n, recent, busy in rows:
        if status == Page.Status.RUNNING and serving is not None and pod_id not in serving:
            status = Page.Status.PENDING
        counts[job_id][status] += n
        if status == Page.Status.DONE:
            counts[job_id]["recent"] += recent
            if pod_id is not None and busy is not None:
                busy_on_pods[job_id][pod_id] = (busy, state, cost_per_hr, lanes)
    return counts, busy_on_pods


def _pages_of_jobs(job_ids, since):
    """The jobs' pages by status and pod, with the pod's state, price and lanes: how many, how many
    finished since ``since``, and the seconds they held it."""
    return (
        Page.objects.filter(job_id__in=job_ids)
        .order_by()
        .values("job_id", "status", "pod_id", "pod__state", "pod__cost_per_hr", "pod__lanes")
        .annotate(n=Count("id"), recent=Count("id", filter=Q(finished_at__gte=since)), busy=Sum("seconds"))
        .values_list(
            "job_id", "status", "pod_id", "pod__state", "pod__cost_per_hr", "pod__lanes", "n", "recent", "busy"
        )
    )


class _Minute(Func):
    """A timestamp's minute in SQL: on PostgreSQL the minutes since 1970 (date_trunc converts each row to
    the session's time zone), on SQLite the stored text's "YYYY-MM-DD HH:MM" (TruncMinute calls Python)."""

    template = "CAST(floor(date_part('epoch', %(expressions)s) / 60) AS bigint)"
    output_field = DateTimeField()  # on SQLite, parsed as one; on PostgreSQL a number (no converter)

    def as_sqlite(self, compiler, connection, **extra):
        return self.as_sql(compiler, connection, template="substr(%(expressions)s, 1, 16)", **extra)


def _pages_done_by_minute(since):
    return (
        Page.objects.filter(status=Page.Status.DONE, finished_at__gte=since)
        .annotate(minute=_Minute("finished_at"))
        .values("minute")
        .annotate(n=Count("id"))
        .values_list("minute", "n")
    )


def pages_done_by_minute(*, since: datetime) -> dict[datetime, int]:
    """{minute (UTC): pages done in it} since ``since``, counted in SQL."""
    rows = _pages_done_by_minute(since=since)
    return {
        minute.astimezone(UTC) if isinstance(minute, datetime) else datetime.fromtimestamp(minute * 60, UTC): n
        for minute, n in rows
    }


def pages_done_in_minutes(minutes: list[datetime]) -> dict[datetime, int]:
    """{minute: pages done in it} of a few minutes (each on the minute), each counted over its own
    range of the (status, finished_at) index: the broadcaster's last minutes, every second. A row
    a minute, grouped in SQL, cost 1.5 ms on SQLite for 2,900 pages (the text cut to the minute
    for each page, then sorted); this way 0.3 ms, and 0.9 ms instead of 1.9 on PostgreSQL."""
    if not minutes:
        return {}
    adapt = connection.ops.adapt_datetimefield_value
    count = f"(SELECT COUNT(*) FROM {Page._meta.db_table} WHERE status = %s AND finished_at >= %s AND finished_at < %s)"
    params = []
    for minute in minutes:
        params += [Page.Status.DONE, adapt(minute), adapt(minute + timedelta(minutes=1))]
    with connection.cursor() as cursor:
        cursor.execute("SELECT " + ", ".join([count] * len(minutes)), params)
        counts = cursor.fetchone()
    return {minute: n for minute, n in zip(minutes, counts, strict=True) if n}


def pages_at_pods(*, now: datetime) -> dict[int, int]:
    """{pod id: pages out at it under a live claim} of every pod holding one: as many rows as
    pods busy, whatever the backlog (a page waiting in a dispatcher for a lane has no pod yet)."""
    return dict(
        Page.objects.filter(status=Page.Status.RUNNING, claim_expires_at__gte=now, pod_id__isnull=False)
        .values("pod_id")
        .annotate(n=Count("id"))
        .values_list("pod_id", "n")
    )


def pages_in_flight_by_pod(pod_ids: list[int], *, now: datetime) -> dict[int, int]:
    """Pages each pod holds under a live claim."""
    return dict(
        Page.objects.filter(pod_id__in=pod_ids, status=Page.Status.RUNNING, claim_expires_at__gte=now)
        .values("pod_id")
        .annotate(n=Count("id"))
        .values_list("pod_id", "n")
    )
