"""pods asks and tells ocrjobs only through pods/hooks.py, which ocrjobs fills at start-up: every
hook is there and reaches ocrjobs, and a missing one fails loudly instead of doing nothing."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

import pytest
from django.utils import timezone

from ocrjobs.models import Page
from pods import hooks
from pods.models import Pod
from pods.services.lifecycle import pod_end
from tests.ocrjobs.helpers import split, submit, tiff_bytes


def test_ocrjobs_registered_a_callable_for_every_hook():
    registered = hooks.jobs()
    assert all(callable(getattr(registered, f.name)) for f in dataclasses.fields(hooks.Jobs))


def test_asking_before_anything_was_registered_raises(monkeypatch):
    monkeypatch.setattr(hooks, "_registered", None)
    with pytest.raises(hooks.HooksMissing, match="no app registered"):
        hooks.jobs().pages_waiting(pool_id=1)


def test_hooks_with_one_missing_are_refused_when_built():
    given = {f.name: getattr(hooks.jobs(), f.name) for f in dataclasses.fields(hooks.Jobs)}
    del given["pod_lost"]
    with pytest.raises(TypeError, match="pod_lost"):
        hooks.Jobs(**given)


@pytest.fixture
def page_at_pod(local_pool, ordinary_user):
    job = submit(ordinary_user, {"a.tiff": tiff_bytes([(200, 100)])}, pool_key=local_pool.key)
    split(job)
    pod = Pod.objects.create(pool=local_pool, name="hooked", state=Pod.State.READY, provider_id="p1", lanes=2)
    now = timezone.now()
    job.pages.update(status=Page.Status.RUNNING, pod=pod, attempts=1, claim_token="t",
                     claim_expires_at=now + timedelta(minutes=1))  # fmt: skip
    return pod, job.pages.get()


def test_a_pod_ended_by_pods_puts_its_pages_back_in_ocrjobs_queue(page_at_pod):
    pod, page = page_at_pod
    pod_end(pod=pod, state=Pod.State.LOST, error="gone")
    page.refresh_from_db()
    assert (page.status, page.claim_token, page.attempts) == (Page.Status.PENDING, "", 1)


def test_a_pod_preempted_is_told_to_ocrjobs_whose_pages_wait_again_unspent(page_at_pod):
    pod, page = page_at_pod
    assert hooks.jobs().pod_preempted(pod_id=pod.pk, at=timezone.now()) == 1
    page.refresh_from_db()
    assert (page.status, page.attempts) == (Page.Status.PENDING, 0)
