"""Every pod costs money: its spend is split between the jobs it served and its pool.

A job's share is the pod's price per lane-second times the seconds its pages
held a lane; what is left (booting, idle lanes) belongs to the pool alone.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from decimal import Decimal

from django.db.models import QuerySet, Sum
from django.utils import timezone

from pods import hooks
from pods.models import Pod, SpendEntry

MICRO = Decimal("0.000001")


def job_shares(pod: Pod, *, since: datetime | None = None) -> dict[int, tuple[Decimal, float]]:
    """{job id: (dollars, busy seconds)} of the pages this pod stored."""
    if not pod.cost_per_hr or not pod.lanes:
        return {}
    busy = hooks.jobs().busy_seconds(pod_ids=[pod.pk], since=since)
    return {job_id: (_share(pod, seconds), float(seconds)) for (_, job_id), seconds in busy.items()}


def spend_attribute(pod: Pod) -> list[SpendEntry]:
    """Write the pod's spend entries as it ends (once: a second call writes nothing)."""
    if pod.billed_from is None or pod.spend_entries.exists():
        return []
    end = pod.ended_at or timezone.now()
    billed_seconds = max(0.0, (end - pod.billed_from).total_seconds())
    total = (pod.cost_per_hr * Decimal(str(billed_seconds)) / Decimal(3600)).quantize(MICRO)
    entries = []
    attributed = Decimal("0")
    for job_id, (dollars, busy) in job_shares(pod).items():
        dollars = min(dollars, total - attributed)  # rounding never attributes more than was billed
        attributed += dollars
        entries.append(SpendEntry(pod=pod, pool_id=pod.pool_id, job_id=job_id, dollars=dollars, seconds=busy, at=end))
    entries.append(SpendEntry(pod=pod, pool_id=pod.pool_id, job=None, dollars=total - attributed,
                              seconds=billed_seconds, at=end))  # fmt: skip
    return SpendEntry.objects.bulk_create(entries)


def spend_report(*, since: datetime | None = None) -> dict:
    """Spend by pool, pod and job: entries of ended pods plus what live pods have cost so far."""
    by_pool: dict[str, Decimal] = {}
    by_job: dict[int, Decimal] = {}
    by_pod: dict[str, Decimal] = {}
    entries = SpendEntry.objects.all()
    if since is not None:
        entries = entries.filter(at__gte=since)
    # Summed by the database: the cost of a report follows the pools, pods and jobs, not the entries.
    for total, group, key in (
        (by_pool, "pool__key", "pool__key"),
        (by_pod, "pod__name", "pod__name"),
        (by_job, "job_id", "job_id"),
    ):
        for row in (
            entries.filter(**{f"{key}__isnull": False}).values(group).annotate(dollars=Sum("dollars")).order_by()
        ):
            total[row[group]] = row["dollars"]
    now = timezone.now()
    per_hour = Decimal(0)
    for pod in Pod.objects.alive().exclude(billed_from=None).select_related("pool"):
        per_hour += pod.cost_per_hr
        start = max(pod.billed_from, since) if since else pod.billed_from
        dollars = (pod.cost_per_hr * Decimal(str(max(0.0, (now - start).total_seconds()))) / Decimal(3600)).quantize(
            MICRO
        )
        by_pool[pod.pool.key] = by_pool.get(pod.pool.key, Decimal(0)) + dollars
        by_pod[pod.name] = by_pod.get(pod.name, Decimal(0)) + dollars
        for job_id, (share, _) in job_shares(pod, since=since).items():
            by_job[job_id] = by_job.get(job_id, Decimal(0)) + share
    return {
        "since": since.isoformat() if since else None,
        "at": now.isoformat(),
        "dollars_per_hour": float(per_hour),
        "total": float(sum(by_pool.values(), Decimal(0))),
        "by_pool": {key: float(value) for key, value in sorted(by_pool.items())},
        "by_pod": {key: float(value) for key, value in sorted(by_pod.items())},
        "by_job": {str(key): float(value) for key, value in sorted(by_job.items())},
    }


def jobs_spend(
    job_ids: Iterable[int],
    *,
    busy_on_pods: dict[int, dict[int, tuple]] | None = None,
    entries: dict[int, Decimal] | None = None,
) -> dict[int, Decimal]:
    """What each job has cost so far, in three queries whatever the number of jobs: its
    entries from ended pods, and its shares of live ones as ``job_shares`` counts them.
    Only the live pods that served these jobs are read (the live pods are a subquery), so the
    cost follows the jobs' pages, not the size of the fleet. Given ``busy_on_pods`` ({job id:
    {pod id: (seconds, state, $/h, lanes)}}, as ocrjobs.selectors.job_progress reads them),
    the entries are the one query; given ``entries`` too ({job id: the dollars of its
    entries}, as ocrjobs.selectors.jobs_for_dashboard reads them), none."""
    spend = dict.fromkeys(job_ids, Decimal(0))
    if not spend:
        return spend
    if entries is None:
        summed = SpendEntry.objects.filter(job_id__in=spend).values("job_id").annotate(dollars=Sum("dollars"))
        entries = dict(summed.values_list("job_id", "dollars"))
    for job_id, dollars in entries.items():
        if job_id in spend:
            spend[job_id] += dollars
    for job_id, dollars in live_shares(list(spend), busy_on_pods=busy_on_pods).items():
        spend[job_id] += dollars
    return spend


def live_shares(
    job_ids: Iterable[int] | QuerySet,
    *,
    busy_on_pods: dict[int, dict[int, tuple]] | None = None,
    per: str = "job_id",
) -> dict[int, Decimal]:
    """{job id: its shares of the live pods that served it}, for the jobs that live pods served
    (the rest are left out). ``job_ids`` may be a queryset of ids: it stays a subquery; with
    ``per="job__owner_id"`` the shares are summed by the jobs' owner in the database, so the read
    costs the same whatever the number of jobs (a user's jobs of the day: ocrjobs.selectors.budgets)."""
    if busy_on_pods is None:
        busy_on_pods = _busy_on_live_pods(job_ids, per=per)
    shares: dict[int, Decimal] = {}
    for key, pods in busy_on_pods.items():
        for seconds, state, cost_per_hr, lanes in pods.values():
            if state in Pod.ALIVE_STATES and cost_per_hr and lanes:
                shares[key] = shares.get(key, Decimal(0)) + _lane_share(cost_per_hr, lanes, seconds)
    return shares


def _busy_on_live_pods(job_ids: Iterable[int] | QuerySet, *, per: str = "job_id") -> dict[int, dict[int, tuple]]:
    busy = hooks.jobs().busy_seconds(pod_ids=Pod.objects.alive().values("pk"), job_ids=job_ids, per=per)
    served = {pod_id for pod_id, _ in busy}
    pods = Pod.objects.filter(pk__in=served).values_list("pk", "state", "cost_per_hr", "lanes") if served else []
    about = {pk: (state, cost_per_hr, lanes) for pk, state, cost_per_hr, lanes in pods}
    result: dict[int, dict[int, tuple]] = {}
    for (pod_id, key), seconds in busy.items():
        if pod_id in about:  # (a pod that ended between the two reads: its entries count next time)
            result.setdefault(key, {})[pod_id] = (seconds, *about[pod_id])
    return result


def _share(pod: Pod, busy: float) -> Decimal:
    """The pod's price per lane-second times ``busy`` lane-seconds."""
    return _lane_share(pod.cost_per_hr, pod.lanes, busy)


def _lane_share(cost_per_hr: Decimal, lanes: int, busy: float) -> Decimal:
    per_lane_second = cost_per_hr / Decimal(3600) / Decimal(lanes)
    return (per_lane_second * Decimal(str(busy))).quantize(MICRO)
