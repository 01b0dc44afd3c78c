"""A failed attempt on an interruptible pod that the provider then preempted is given back, once,
whenever the preemption is noticed: before the page is claimed again, after, or before the failure
itself is stored; and never by changing a newer claim."""

from __future__ import annotations

from django.utils import timezone

from ocrjobs.models import Page
from ocrjobs.services.pages import (
    page_attempt_failed,
    page_complete,
    pages_assign_pods,
    pages_claim,
    pages_requeue_preempted,
)
from pods.models import Pod
from pods.services import preemption
from tests.pods.test_interruptible import new_pod, pages_on, spot_pool

BAD_GATEWAY = "HTTP 502: pod is not running"


def _ready_pods(count: int) -> list[Pod]:
    pool = spot_pool()
    pods = [new_pod(pool) for _ in range(count)]
    Pod.objects.filter(pk__in=[pod.pk for pod in pods]).update(
        state=Pod.State.READY, interruptible=True, billed_from=timezone.now()
    )
    return [Pod.objects.get(pk=pod.pk) for pod in pods]


def _fail_once_on(spot: Pod, page: Page, token: str) -> None:
    [claim] = pages_claim(pool_id=spot.pool_id, token=token, limit=1)
    assert claim.id == page.pk
    pages_assign_pods(token=token, assignments=[(page.pk, claim.attempts, spot.pk)])
    outcome = page_attempt_failed(page_id=page.pk, token=token, pod_id=spot.pk, error=BAD_GATEWAY,
                                  attempt=claim.attempts)  # fmt: skip
    assert outcome == "retry"


def test_an_attempt_failed_on_a_pod_preempted_after_the_page_was_claimed_again_is_given_back_once(db, settings):
    settings.PAGE_MAX_ATTEMPTS = 2
    spot, other = _ready_pods(2)
    [page] = pages_on(spot, 1)
    _fail_once_on(spot, page, "first")
    [again] = pages_claim(pool_id=spot.pool_id, token="second", limit=1)  # before the preemption is noticed
    assert again.attempts == 2

    assert preemption.pod_preempted(pod=spot)
    assert pages_requeue_preempted(pod_id=spot.pk) == 0  # given back once, whoever asks again

    page.refresh_from_db()
    # The newer claim stands (its attempt number unchanged); the attempt is given back beside it.
    assert (page.status, page.claim_token, page.attempts, page.attempts_given_back) == (
        Page.Status.RUNNING, "second", 2, 1,
    )  # fmt: skip
    # So its failure on another pod is not its last attempt (two allowed, one given back): before,
    # the page failed here, its first attempt spent on a pod the provider took back.
    assert page_attempt_failed(page_id=page.pk, token="second", pod_id=other.pk, error="HTTP 500: boom",
                               attempt=2) == "retry"  # fmt: skip
    assert pages_claim(pool_id=spot.pool_id, token="third", limit=1)
    assert page_complete(page_id=page.pk, token="third", pod_id=other.pk, result={"text": "ok"})
    assert Page.objects.get(pk=page.pk).status == Page.Status.DONE


def test_an_attempt_failed_on_a_pod_already_preempted_is_given_back_as_it_is_stored(db):
    spot, _ = _ready_pods(2)
    [page] = pages_on(spot, 1)
    # Out at the pod, its pod not recorded yet (the dispatcher records pods in batches), when the
    # preemption is recorded: the page's failure comes after it.
    [claim] = pages_claim(pool_id=spot.pool_id, token="t", limit=1)
    assert preemption.pod_preempted(pod=spot)
    assert page_attempt_failed(page_id=page.pk, token="t", pod_id=spot.pk, error=BAD_GATEWAY,
                               attempt=claim.attempts) == "retry"  # fmt: skip
    page.refresh_from_db()
    assert (page.status, page.attempts, page.attempts_given_back, page.failed_on_pod_id) == (
        Page.Status.PENDING, 0, 0, None,
    )  # fmt: skip
    assert pages_requeue_preempted(pod_id=spot.pk) == 0
