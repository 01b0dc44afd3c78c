"""Task leases: a split or a boot whose task the broker lost is sent again by the scaler,
and never runs twice at once."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.utils import timezone

from fleetadmin import leases
from ocrjobs.models import Document, Job
from ocrjobs.services.split import document_split, documents_recover
from pods.models import BootAttempt, Pod, pod_name
from pods.providers import get_provider
from pods.services import boot
from tests.factories import pdf_bytes
from tests.ocrjobs.helpers import submit

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
    assert queued()[queued_before:] == ["ocrjobs.tasks.fetch_document", "ocrjobs.tasks.split_document"]
    lost_split.refresh_from_db()
    assert lost_split.task_lease_token == "" and lost_split.task_lease_until > timezone.now()  # queued again
    assert documents_recover(pool_id=waiting.pool_id) == []  # not again before its grace ends


def test_the_scaler_sends_again_the_boots_whose_tasks_were_lost(local_pool, queued):
    def pod(state: str) -> Pod:
        return Pod.objects.create(pool=local_pool, name=pod_name(local_pool, uuid.uuid4().hex[:8]), state=state,
                                  **leases.queued())  # fmt: skip

    lost, fresh, ready = pod(Pod.State.BOOTING), pod(Pod.State.BOOTING), pod(Pod.State.READY)
    expire(Pod.objects.filter(pk__in=[lost.pk, ready.pk]))

    assert boot.boots_recover(pool=local_pool) == [lost.pk]
    assert queued() == ["pods.tasks.boot_pod"]
    assert boot.boots_recover(pool=local_pool) == []
    assert fresh.pk not in boot.boots_recover(pool=local_pool)


def test_a_boot_whose_lease_another_task_holds_creates_nothing(sim, pool):
    pod = Pod.objects.create(pool=pool, name=pod_name(pool, uuid.uuid4().hex[:8]), lanes=2, **leases.queued())
    held = leases.acquire(Pod.objects.filter(pk=pod.pk))

    boot.pod_boot(pod_id=pod.pk)

    pod.refresh_from_db()
    assert (pod.state, pod.provider_id, pod.task_lease_token) == (Pod.State.BOOTING, "", held)
    assert not BootAttempt.objects.filter(pod=pod).exists()


def test_a_boot_that_lost_its_lease_midway_stops_without_failing_or_terminating_the_pod(sim, pool, monkeypatch):
    pod = Pod.objects.create(pool=pool, name=pod_name(pool, uuid.uuid4().hex[:8]), lanes=2, **leases.queued())
    renew = leases.renew
    calls = []

    def taken_over_after_the_create(queryset, token, **kwargs):
        calls.append(token)
        if Pod.objects.filter(pk=pod.pk).exclude(provider_id="").exists():
            expire(Pod.objects.filter(pk=pod.pk))
            leases.acquire(Pod.objects.filter(pk=pod.pk))
        renew(queryset, token, **kwargs)

    monkeypatch.setattr(leases, "renew", taken_over_after_the_create)
    boot.pod_boot(pod_id=pod.pk)

    pod.refresh_from_db()
    assert calls and pod.provider_id  # it created the pod, then lost the lease
    assert pod.state == Pod.State.BOOTING  # left to the task that holds it: not failed, not terminated
    assert get_provider("runpod").get(pod.provider_id) is not None  # still there for the holder to wait for
