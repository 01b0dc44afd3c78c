"""Boot, release, check and the scaler tick, on real local pods."""

from __future__ import annotations

from pathlib import Path

import httpx
from django.utils import timezone

from ocrjobs.models import Document, Job, Page
from pods import podclient
from pods.models import Pod
from pods.providers.local import LocalProvider
from pods.services import boot, lifecycle, passes, reconcile, scaler
from tests.pods.helpers import boot_until_settled


def _pages(pool, count: int) -> list[Page]:
    job = Job.objects.create(pool=pool)
    document = Document.objects.create(job=job, position=0, name="d.pdf", kind="pdf", source="x", size_bytes=1,
                                       page_count=count)  # fmt: skip
    return Page.objects.bulk_create(
        [Page(job=job, document=document, pool=pool, number=n) for n in range(1, count + 1)]
    )


def test_a_tick_boots_for_the_backlog_and_counts_booting_pods_as_capacity(local_pool, prefix, settings):
    settings.SCALE_SECONDS_PER_PAGE_GUESS = 2.0  # no page measured yet
    settings.SCALE_TARGET_SECONDS = 2.0  # drain the backlog in one page time
    settings.SCALE_MAX_OVERHEAD = 0.0  # the time target alone: 14 lane-s pay for no boot otherwise
    local_pool.max_pods = 5
    local_pool.lanes_per_pod = 2
    local_pool.max_parallel_boots = 3
    local_pool.save()
    _pages(local_pool, 7)  # 7 pages × 2 s / (2 lanes × 2 s) = 4 pods wanted, at most 3 booting at once

    first = scaler.pool_tick(pool=local_pool)
    assert len(first.booted) == 3
    assert Pod.objects.filter(state=Pod.State.BOOTING).count() == 3

    second = scaler.pool_tick(pool=local_pool)
    assert second.booted == []  # the three booting pods are capacity, and the boot cap holds

    Pod.objects.filter(pk=first.booted[0]).update(state=Pod.State.FAILED)
    third = scaler.pool_tick(pool=local_pool)
    assert len(third.booted) == 1
    assert Pod.objects.alive().count() == 3


def test_a_tick_stages_its_boots_for_the_passes_and_asks_for_one(
    local_pool, prefix, queued, django_capture_on_commit_callbacks
):
    _pages(local_pool, 1)

    with django_capture_on_commit_callbacks(execute=True):
        booted = scaler.pool_tick(pool=local_pool).booted

    pod = Pod.objects.get(pk__in=booted)
    assert (pod.state, pod.boot_stage, pod.provider_id) == (Pod.State.BOOTING, Pod.BootStage.CREATE, "")
    assert boot.boots_due(now=timezone.now(), limit=10) == [pod.pk]  # its first step is due now
    assert queued() == ["pods.tasks.advance_pods"]  # a pass, not a task per boot


def test_a_tick_without_work_keeps_the_warm_floor_only(local_pool, prefix):
    local_pool.min_pods = 1
    local_pool.max_pods = 3
    local_pool.save()
    result = scaler.pool_tick(pool=local_pool)
    assert len(result.booted) == 1
    assert Pod.objects.get().reason == Pod.Reason.WARM


def test_boot_joins_a_serving_pod_and_release_terminates_it(local_pool, prefix, transactional_db):
    pod = Pod.objects.create(pool=local_pool, name=f"{prefix}-local-boot", lanes=1)
    pod = boot_until_settled(pod.pk)
    assert pod.state == Pod.State.READY, pod.error
    assert podclient.pod_is_serving(pod.base_url, token=pod.token)
    # Its token went into its environment, never onto its command line, and the pod asks for it.
    proc = Path(f"/proc/{pod.provider_id}")
    assert f"POD_TOKEN={pod.token}".encode() in (proc / "environ").read_bytes().split(b"\0")
    assert pod.token.encode() not in (proc / "cmdline").read_bytes()
    assert httpx.get(f"{pod.base_url}/v1/models", timeout=10).status_code == 401
    boot.boot_step(pod.pk)  # a step of a pod that joined: nothing new
    assert boot_until_settled(pod.pk).provider_id == pod.provider_id

    lifecycle.pod_release(pod=pod, reason="test")
    pod.refresh_from_db()
    assert pod.state == Pod.State.TERMINATED and pod.ended_at is not None
    passes.pass_run()
    assert LocalProvider().get(pod.provider_id) is None
    lifecycle.pod_release(pod=pod, reason="again")  # idempotent
    assert Pod.objects.get(pk=pod.pk).state == Pod.State.TERMINATED


def test_a_pod_whose_process_died_is_marked_lost_and_its_pages_wait_again(local_pool, prefix):
    pod = boot_until_settled(Pod.objects.create(pool=local_pool, name=f"{prefix}-local-lost", lanes=1).pk)
    assert pod.state == Pod.State.READY
    page = _pages(local_pool, 1)[0]
    Page.objects.filter(pk=page.pk).update(status=Page.Status.RUNNING, pod=pod, claim_token="x", attempts=1)
    LocalProvider().terminate(pod.provider_id)  # the process goes away behind fleetadmin's back

    result = reconcile.reconcile(provider_name="local")
    assert result.lost == [pod.name]
    assert Pod.objects.get(pk=pod.pk).state == Pod.State.LOST
    page.refresh_from_db()
    assert page.status == Page.Status.PENDING and page.claim_token == ""


def test_only_a_ready_pod_is_drained_and_the_scaler_hears_of_it(local_pool, queued):
    ready = Pod.objects.create(pool=local_pool, name="fa-local-sick", state=Pod.State.READY, lanes=1)
    booting = Pod.objects.create(pool=local_pool, name="fa-local-boot", state=Pod.State.BOOTING, lanes=1)

    assert lifecycle.pod_drain(pod_id=ready.pk, error="3 failed pages: HTTP 500") is True
    assert lifecycle.pod_drain(pod_id=ready.pk, error="again") is False  # drained already
    assert lifecycle.pod_drain(pod_id=booting.pk, error="refused") is False

    ready.refresh_from_db()
    assert (ready.state, ready.error) == (Pod.State.DRAINING, "drained after 3 failed pages: HTTP 500")
    assert Pod.objects.get(pk=booting.pk).state == Pod.State.BOOTING
    assert queued() == ["pods.tasks.scaler_tick"]  # once, for the pod that was drained


def test_pods_marked_busy_are_busy_from_then_and_the_others_untouched(local_pool):
    busy, idle = (Pod.objects.create(pool=local_pool, name=f"fa-local-{n}", state=Pod.State.READY, lanes=1)
                  for n in ("busy", "idle"))  # fmt: skip
    at = timezone.now()

    lifecycle.pods_mark_busy(pod_ids=[busy.pk], at=at)
    lifecycle.pods_mark_busy(pod_ids=[], at=at)  # nothing out: nothing written

    assert Pod.objects.get(pk=busy.pk).last_busy_at == at
    assert Pod.objects.get(pk=idle.pk).last_busy_at is None


def test_a_pod_ends_once_a_later_end_neither_counts_it_again_nor_changes_how_it_ended(local_pool):
    # Review L8: a release then a reconcile that finds the pod gone used to turn TERMINATED into
    # LOST; on PostgreSQL, racing, both could count it in the pool's tally.
    from pods.models import PoolPodTally

    pod = Pod.objects.create(pool=local_pool, name="fa-local-once", state=Pod.State.READY, lanes=1,
                             billed_from=timezone.now())  # fmt: skip
    lifecycle.pod_end(pod=Pod.objects.get(pk=pod.pk), state=Pod.State.TERMINATED, error="released: by hand")
    later = lifecycle.pod_end(pod=Pod.objects.get(pk=pod.pk), state=Pod.State.LOST, error="gone")

    stored = Pod.objects.get(pk=pod.pk)
    assert (stored.state, stored.error) == (Pod.State.TERMINATED, "released: by hand")
    assert later.state == Pod.State.TERMINATED
    tally = PoolPodTally.objects.get(pool=local_pool)
    assert (tally.terminated, tally.lost) == (1, 0)
