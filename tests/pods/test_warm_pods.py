"""The local warm pod: what ``manage.py up`` keeps ready (LOCAL_WARM_PODS), so that a job's first
page waits for no boot; and a split that finds a ready pod starts a dispatcher without a tick."""

from __future__ import annotations

from django.utils import timezone

from ocrjobs.models import Page
from pods.models import Pod
from pods.services import scaler
from tests.factories import pdf_bytes
from tests.ocrjobs.helpers import split, submit
from tests.pods.test_scaler import _pod


def test_a_local_pool_boots_its_warm_pod_without_work(local_pool, settings, queued):
    settings.LOCAL_WARM_PODS = 1

    result = scaler.pool_tick(pool=local_pool)

    (pod,) = Pod.objects.filter(pool=local_pool)
    assert result.booted == [pod.pk] and result.wanted == 1
    assert pod.reason == Pod.Reason.WARM and pod.state == Pod.State.BOOTING
    scaler.pool_tick(pool=local_pool)
    assert Pod.objects.filter(pool=local_pool).count() == 1  # one warm pod, not one per tick


def test_a_warm_pod_that_was_never_busy_is_not_shed(local_pool, settings):
    settings.LOCAL_WARM_PODS = 1
    pod = _pod(local_pool, state=Pod.State.READY, ready_at=timezone.now(), base_url="http://127.0.0.1:9")

    result = scaler.pool_tick(pool=local_pool, force_shed=True)

    assert result.shed == [] and result.booted == []
    pod.refresh_from_db()
    assert pod.state == Pod.State.READY


def test_without_a_warm_floor_a_never_busy_pod_is_shed_at_once(local_pool, settings):
    settings.LOCAL_WARM_PODS = 0
    pod = _pod(local_pool, state=Pod.State.READY, ready_at=timezone.now(), base_url="http://127.0.0.1:9")

    result = scaler.pool_tick(pool=local_pool)

    assert result.shed == [pod.pk]


def test_the_warm_floor_is_capped_by_max_pods_and_is_only_for_local_pools(local_pool, pool, settings):
    settings.LOCAL_WARM_PODS = 3
    assert scaler.pool_floor(local_pool) == 1  # its max pods
    assert scaler.pool_floor(pool) == 0  # a RunPod pool keeps only its own min pods
    local_pool.max_pods = 0
    assert scaler.pool_floor(local_pool) == 0


def test_a_split_with_a_ready_pod_starts_a_dispatcher_and_queues_no_tick(
    local_pool, admin_user, queued, django_capture_on_commit_callbacks
):
    _pod(local_pool, state=Pod.State.READY, ready_at=timezone.now(), base_url="http://127.0.0.1:9")
    job = submit(admin_user, {"a.pdf": pdf_bytes()})
    queued_before = queued()

    with django_capture_on_commit_callbacks(execute=True):
        split(job)

    assert Page.objects.filter(job=job).count() == 3
    assert queued()[len(queued_before) :] == ["ocrjobs.tasks.dispatch_pool"]
    assert Pod.objects.filter(pool=local_pool).count() == 1  # nothing booted for the first page


def test_a_split_without_a_ready_pod_nudges_the_scaler(
    local_pool, admin_user, queued, django_capture_on_commit_callbacks
):
    job = submit(admin_user, {"a.pdf": pdf_bytes()})
    queued_before = queued()

    with django_capture_on_commit_callbacks(execute=True):
        split(job)

    assert queued()[len(queued_before) :] == ["pods.tasks.scaler_tick"]
