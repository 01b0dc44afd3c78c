"""Task leases: a split whose task the broker lost is sent again by the scaler, a boot whose step
died is due again once its lease lapses, and neither runs twice at once."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.utils import timezone

from fleetadmin import leases
from ocrjobs.models import Document, Job
from ocrjobs.services.recover import documents_recover
from ocrjobs.services.split import document_split
from pods.models import BootAttempt, Pod, pod_name
from pods.services import boot
from tests.factories import pdf_bytes
from tests.ocrjobs.helpers import submit
from tests.pods.helpers import boot_until_settled

pytestmark = pytest.mark.django_db


def expire(queryset) -> None:
    queryset.update(task_lease_until=timezone.now() - timedelta(seconds=1))


def test_a_queued_row_is_taken_by_one_task_at_a_time_until_its_lease_expires(ordinary_user):
    job = submit(ordinary_user, {"report.pdf": pdf_bytes()})
    row = Document.objects.filter(job=job)
    assert row.get().task_lease_token == ""  # queued, not started

    first = leases.acquire(row)
    assert first and leases.acquire(row) is None
    leases.renew(row, first)

    expire(row)
    second = leases.acquire(row)
    assert second not in (None, first)
    with pytest.raises(leases.LeaseLost):
        leases.renew(row, first)  # the first task woke up late: it must stop


def test_a_released_lease_is_free_and_counts_as_expired(ordinary_user):
    job = submit(ordinary_user, {"report.pdf": pdf_bytes()})
    row = Document.objects.filter(job=job)
    token = leases.acquire(row)
    assert not leases.expired(row).exists()

    leases.release(row, "not-the-holder")
    assert not leases.expired(row).exists()
    leases.release(row, token)

    assert leases.expired(row).exists()
    assert leases.acquire(row) is not None


def test_a_split_whose_lease_another_task_holds_makes_no_page(ordinary_user):
    job = submit(ordinary_user, {"report.pdf": pdf_bytes()})
    document = job.documents.get()
    held = leases.acquire(Document.objects.filter(pk=document.pk))

    document_split(document_id=document.pk)

    document.refresh_from_db()
    assert (document.status, document.pages.count(), document.task_lease_token) == (Document.Status.PENDING, 0, held)


def test_a_split_that_lost_its_lease_midway_stops_and_leaves_the_rest_to_the_holder(ordinary_user, monkeypatch):
    job = submit(ordinary_user, {"report.pdf": pdf_bytes(["page"] * 30)})
    document = job.documents.get()
    renew = leases.renew

    def taken_over(queryset, token, **kwargs):
        expire(Document.objects.filter(pk=document.pk))
        leases.acquire(Document.objects.filter(pk=document.pk))  # another task, after ours looked dead
        renew(queryset, token, **kwargs)

    monkeypatch.setattr(leases, "renew", taken_over)
    document_split(document_id=document.pk)

    document.refresh_from_db()
    assert document.status == Document.Status.PENDING
    assert document.pages.count() == 0  # its first batch was not saved: the holder makes every page


def test_the_scaler_sends_again_the_splits_and_fetches_whose_tasks_were_lost(ordinary_user, queued):
    waiting = submit(ordinary_user, {"a.pdf": pdf_bytes(), "b.pdf": pdf_bytes()})
    started = submit(ordinary_user, {"c.pdf": pdf_bytes()})
    split = submit(ordinary_user, {"d.pdf": pdf_bytes()})
    cancelled = submit(ordinary_user, {"e.pdf": pdf_bytes()})
    document_split(document_id=split.documents.get().pk)
    Job.objects.filter(pk=cancelled.pk).update(status=Job.Status.CANCELLED)
    url = Document.objects.create(job=started, position=1, name="f", kind=Document.Kind.URL, url="https://x.test/f",
                                  size_bytes=0, page_count=0, **leases.queued())  # fmt: skip
    leases.acquire(Document.objects.filter(pk=started.documents.get(position=0).pk))  # running, lease fresh
    lost_split = waiting.documents.get(position=0)
    expire(Document.objects.filter(pk__in=[lost_split.pk, url.pk, split.documents.get().pk]))
    expire(cancelled.documents.all())
    queued_before = len(queued())

    sent = documents_recover(pool_id=waiting.pool_id)

    assert sorted(sent) == sorted([lost_split.pk, url.pk])
    assert queued()[queued_before:] == ["ocrjobs.tasks.split_document", "ocrjobs.tasks.fetch_document"]
    lost_split.refresh_from_db()
    assert lost_split.task_lease_token == "" and lost_split.task_lease_until > timezone.now()  # queued again
    assert documents_recover(pool_id=waiting.pool_id) == []  # not again before its grace ends


def test_a_boot_is_due_once_its_step_is_and_no_step_holds_its_lease(local_pool):
    def pod(state: str = Pod.State.BOOTING, **fields) -> Pod:
        return Pod.objects.create(pool=local_pool, name=pod_name(local_pool, uuid.uuid4().hex[:8]), state=state,
                                  **{**boot.staged(Pod.BootStage.RUNNING), **fields})  # fmt: skip

    waiting = pod()
    later = pod(step_at=timezone.now() + timedelta(minutes=1))
    stepping, dead = pod(), pod()
    pod(Pod.State.READY)
    assert leases.acquire(Pod.objects.filter(pk=stepping.pk))  # a step works on it now
    assert leases.acquire(Pod.objects.filter(pk=dead.pk))
    expire(Pod.objects.filter(pk=dead.pk))  # the step's worker was killed: its lease lapsed

    assert boot.boots_due(now=timezone.now(), limit=10) == [waiting.pk, dead.pk]
    assert boot.boots_due(now=timezone.now(), limit=1) == [waiting.pk]  # the longest waiting first
    assert later.pk in boot.boots_due(now=later.step_at, limit=10)


def test_a_boot_whose_lease_another_task_holds_creates_nothing(sim, pool):
    pod = Pod.objects.create(pool=pool, name=pod_name(pool, uuid.uuid4().hex[:8]), lanes=2,
                             **boot.staged(Pod.BootStage.CREATE))  # fmt: skip
    held = leases.acquire(Pod.objects.filter(pk=pod.pk))

    boot.boot_step(pod.pk)

    pod.refresh_from_db()
    assert (pod.state, pod.provider_id, pod.task_lease_token) == (Pod.State.BOOTING, "", held)
    assert not BootAttempt.objects.filter(pod=pod).exists()


def test_a_boot_step_that_lost_its_lease_in_its_create_leaves_the_pod_to_the_holder(sim, pool, monkeypatch):
    pod = Pod.objects.create(pool=pool, name=pod_name(pool, uuid.uuid4().hex[:8]), lanes=2,
                             **boot.staged(Pod.BootStage.CREATE))  # fmt: skip
    renew = leases.renew
    calls = []

    def taken_over_during_the_create(queryset, token, **kwargs):
        calls.append(token)
        expire(Pod.objects.filter(pk=pod.pk))
        leases.acquire(Pod.objects.filter(pk=pod.pk))  # another step, after this one looked dead
        renew(queryset, token, **kwargs)

    monkeypatch.setattr(leases, "renew", taken_over_during_the_create)
    while not calls:  # the walk: candidates without capacity first, then the create that is taken over
        assert Pod.objects.get(pk=pod.pk).state == Pod.State.BOOTING
        boot.boot_step(pod.pk)
    monkeypatch.setattr(leases, "renew", renew)

    pod.refresh_from_db()
    assert pod.state == Pod.State.BOOTING  # left to the step that holds it: not failed, not terminated
    assert (pod.boot_stage, pod.provider_id) == (Pod.BootStage.CREATING, "")  # nor saved by the one that lost it
    [created] = [p for p in sim.pods() if p["name"] == pod.name]
    expire(Pod.objects.filter(pk=pod.pk))  # the holder's step ends (its lease lapses)
    assert boot_until_settled(pod.pk).provider_id == created["id"]  # the next step adopts it by its name
    assert sim.stats()["pods_total"] == 1
