"""A page is not lost to a preemption: a page whose last attempt failed on an interruptible pod
after the provider took it back (the dispatcher saw the pod vanish first, on the page's last
attempt) waits again, its attempt given back, once the preemption is recorded; a page that failed
there before the preemption, or whose job has ended, stays as it is."""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from ocrjobs.models import Job, Page
from pods.models import Pod
from pods.services import preemption
from tests.pods.helpers import boot_until_settled, new_pod
from tests.pods.test_interruptible import pages_on, spot_pool, spot_sim  # noqa: F401 (a fixture)


def test_a_page_failed_for_good_on_a_preempted_pod_waits_again(spot_sim, db, settings):  # noqa: F811
    pod = boot_until_settled(new_pod(spot_pool()).pk)
    now = timezone.now()
    after, before, ended = pages_on(pod, 3)
    failed = {"status": Page.Status.FAILED, "pod": pod, "attempts": settings.PAGE_MAX_ATTEMPTS, "error": "HTTP 502"}
    Page.objects.filter(pk=after.pk).update(**failed, finished_at=now)  # its last attempt died with the pod
    Page.objects.filter(pk=before.pk).update(**failed, finished_at=now - timedelta(minutes=5))  # a real failure
    Page.objects.filter(pk=after.pk).update(**failed, finished_at=now)
    second_job = pages_on(pod, 1)[0]
    Page.objects.filter(pk=second_job.pk).update(**failed, finished_at=now)
    Job.objects.filter(pk=second_job.job_id).update(status=Job.Status.PARTIAL, finished_at=now)  # ended: final
    Page.objects.filter(pk=ended.pk).update(status=Page.Status.DONE)

    assert preemption.pod_preempted(pod=pod, at=now - timedelta(seconds=30))

    pages = {p.pk: p for p in Page.objects.all()}
    assert (pages[after.pk].status, pages[after.pk].attempts) == (Page.Status.PENDING, settings.PAGE_MAX_ATTEMPTS - 1)
    assert pages[after.pk].pod_id is None and pages[after.pk].finished_at is None
    assert pages[before.pk].status == Page.Status.FAILED  # it failed before the pod was taken back
    assert pages[second_job.pk].status == Page.Status.FAILED  # its job has ended: the verdict stands
    assert Job.objects.get(pk=after.job_id).status == Job.Status.RUNNING
    assert Pod.objects.get(pk=pod.pk).state == Pod.State.FAILED


def test_a_last_attempt_that_fails_on_a_pod_already_preempted_is_not_the_pages_failure(spot_sim, db, settings):  # noqa: F811
    from ocrjobs.services.pages import page_attempt_failed

    pod = boot_until_settled(new_pod(spot_pool()).pk)
    page = pages_on(pod, 1)[0]
    Page.objects.filter(pk=page.pk).update(status=Page.Status.RUNNING, pod=pod, claim_token="t",
                                           attempts=settings.PAGE_MAX_ATTEMPTS)  # fmt: skip
    Pod.objects.filter(pk=pod.pk).update(preempted_at=timezone.now())  # recorded before the failure came in
    outcome = page_attempt_failed(page_id=page.pk, token="t", pod_id=pod.pk, error="HTTP 502")
    page.refresh_from_db()
    assert outcome == "retry" and page.status == Page.Status.PENDING
    assert page.attempts == settings.PAGE_MAX_ATTEMPTS - 1  # given back: the page may be read again
