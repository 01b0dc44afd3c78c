"""fleetadmin.compiled: a read's SQL compiled once, run with each call's values, its rows as the
queryset's."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.db import connection
from django.db.models import Count
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from fleetadmin.compiled import IdsOf, compiled_read
from fleetadmin.models import LoopHeartbeat
from ocrjobs.models import Job
from pods.models import BootAttempt, Pod
from tests.pods.dashboard_fixtures import make_job


@pytest.fixture
def pods(local_pool):
    now = timezone.now()
    return [
        Pod.objects.create(pool=local_pool, name=f"fa-local-{i}", state=Pod.State.READY, lanes=2,
                           cost_per_hr=Decimal("0.25") * (i + 1), billed_from=now - timedelta(minutes=10 * i))
        for i in range(3)
    ]  # fmt: skip


@compiled_read
def _billed_since(since):
    return Pod.objects.filter(billed_from__gte=since).order_by("name").values_list("name", "cost_per_hr")


def test_each_call_reads_with_its_own_values_and_sees_rows_written_since(pods, local_pool):
    now = timezone.now()

    assert _billed_since(since=now - timedelta(minutes=5)) == [("fa-local-0", Decimal("0.25"))]
    assert [name for name, _ in _billed_since(since=now - timedelta(minutes=15))] == ["fa-local-0", "fa-local-1"]
    Pod.objects.create(pool=local_pool, name="fa-local-new", state=Pod.State.READY, billed_from=now,
                       cost_per_hr=Decimal("0.10"))  # fmt: skip
    assert _billed_since(since=now - timedelta(minutes=5)) == [("fa-local-0", Decimal("0.25")),
                                                               ("fa-local-new", Decimal("0.10"))]  # fmt: skip


def test_it_runs_the_sql_it_compiled_without_building_the_queryset_again(pods):
    built = []

    @compiled_read
    def names(since):
        built.append(since)
        return Pod.objects.filter(billed_from__gte=since).values_list("name")

    now = timezone.now()
    for minutes in (5, 15, 25):
        with CaptureQueriesContext(connection) as captured:
            assert len(names(since=now - timedelta(minutes=minutes))) == minutes // 10 + 1
        assert len(captured) == 1
    assert len(built) == 2  # compiled twice, with two sets of stand-ins, once


@pytest.mark.parametrize("minutes_ago", [0, 30])
def test_a_datetime_shifted_inside_the_queryset_is_shifted_at_each_call(db, minutes_ago):
    now = timezone.now()
    LoopHeartbeat.objects.create(name="fresh", kind="front", host="h", pid=1, updated_at=now)
    LoopHeartbeat.objects.create(name="silent", kind="worker", host="h", pid=2, updated_at=now - timedelta(minutes=5))
    loops = compiled_read(lambda now: LoopHeartbeat.objects.for_dashboard(now=now).order_by("name"))
    at = now + timedelta(minutes=minutes_ago)

    expected = [(row.name, row.stale) for row in LoopHeartbeat.objects.for_dashboard(now=at).order_by("name")]
    assert [(row.name, row.stale) for row in loops(now=at)] == expected
    assert expected == (
        [("fresh", False), ("silent", True)] if minutes_ago == 0 else [("fresh", True), ("silent", True)]
    )


def test_model_instances_come_with_their_related_objects_as_the_queryset_gives_them(pods):
    for pod in pods:
        BootAttempt.objects.create(pod=pod, candidate=f"c-{pod.name}", outcome="created", seconds=1.0)
    attempts = compiled_read(
        lambda since: (
            BootAttempt.objects.select_related("pod__pool")
            .only("candidate", "created_at", "pod__name", "pod__pool__key")
            .filter(created_at__gte=since)
            .order_by("candidate")
        )
    )

    found = attempts(since=timezone.now() - timedelta(minutes=1))
    with CaptureQueriesContext(connection) as captured:
        shown = [(a.pk, a.candidate, a.created_at, a.pod.name, a.pod.pool.key) for a in found]
    expected = BootAttempt.objects.select_related("pod__pool").order_by("candidate")
    assert shown == [(a.pk, a.candidate, a.created_at, a.pod.name, a.pod.pool.key) for a in expected]
    assert len(captured) == 0 and len(shown) == 3


def test_lists_of_ids_of_each_length_are_compiled_on_their_own(pods, local_pool, ordinary_user):
    jobs = [make_job(ordinary_user, local_pool, pages=n + 1) for n in range(3)]
    pages = compiled_read(
        lambda job_ids: Job.objects.filter(pk__in=job_ids).annotate(n=Count("pages")).order_by("pk").values_list("n")
    )

    assert pages(job_ids=[jobs[2].pk]) == [(3,)]
    assert pages(job_ids=[jobs[0].pk, jobs[2].pk]) == [(1,), (3,)]
    assert pages(job_ids=[jobs[1].pk]) == [(2,)]
    with CaptureQueriesContext(connection) as captured:
        assert pages(job_ids=[]) == []
    assert len(captured) == 0


def test_ids_of_sliced_querysets_are_one_subquery_with_each_calls_values(pods, local_pool):
    BootAttempt.objects.bulk_create(
        [BootAttempt(pod=pods[i % 3], candidate=f"c{i}", outcome="created" if i % 2 else "error", seconds=1.0)
         for i in range(8)]
    )  # fmt: skip
    newest = compiled_read(
        lambda pod_id: (
            BootAttempt.objects.filter(
                pk__in=IdsOf(
                    BootAttempt.objects.filter(pod_id=pod_id).order_by("-id")[:1],
                    BootAttempt.objects.exclude(outcome="created").order_by("-id")[:2],
                )
            )
            .order_by("id")
            .values_list("candidate")
        )
    )

    with CaptureQueriesContext(connection) as captured:
        assert newest(pod_id=pods[0].pk) == [("c4",), ("c6",)]  # c6 is both walks' (pods[0]: c0, c3, c6)
        assert newest(pod_id=pods[1].pk) == [("c4",), ("c6",), ("c7",)]
    assert len(captured) == 2


@pytest.mark.parametrize(
    ("build", "why"),
    [
        (lambda since: Pod.objects.filter(billed_from__date=since.date()).values_list("name"), "not an argument"),
        (lambda since: Pod.objects.filter(billed_from__gte=timezone.now()).values_list("name"), "not an argument"),
        (lambda limit: Pod.objects.values_list("name")[:limit], "changes the SQL"),  # inlined
        (lambda since: Pod.objects.filter(billed_from__gte=since).values("name"), "tuples only"),
    ],
    ids=["a-date-of-it", "a-clock-inside", "a-slice", "dicts"],
)
def test_a_read_whose_sql_depends_on_more_than_its_parameters_is_refused(db, build, why):
    read = compiled_read(build)
    argument = {"limit": 3} if "limit" in build.__code__.co_varnames else {"since": timezone.now()}

    with pytest.raises(ValueError, match=why):
        read(**argument)
