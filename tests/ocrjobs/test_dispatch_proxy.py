"""RunPod's HTTP proxy cuts a request at 100 s (Cloudflare answers 524): the dispatcher counts that
as a pod-side timeout of the page, not a fault of the pod, and a page cut every time fails with an
error that says why, not with Cloudflare's HTML page."""

from __future__ import annotations

from ocrjobs.models import Job, Page
from pods.models import Pod
from tests.factories import image_bytes
from tests.ocrjobs.helpers import run_dispatch_loop, split, submit


def test_a_page_cut_by_runpods_proxy_is_tried_again_and_done(sim_pool, ordinary_user):
    sim_pool.sim.set_faults([{"kind": "proxy_timeout", "count": 1}])
    job = submit(ordinary_user, {"note.png": image_bytes(["a note"])}, pool_key=sim_pool.pool.key)
    split(job)

    run_dispatch_loop(sim_pool.pool)

    page = Page.objects.get(job=job)
    assert (page.status, page.attempts) == (Page.Status.DONE, 2)  # the cut cost one attempt
    assert sim_pool.sim.stats()["proxy_timeouts_injected"] == 1
    assert Pod.objects.get(pk=sim_pool.pod.pk).state == Pod.State.READY  # not the pod's fault


def test_a_page_cut_every_time_fails_with_the_proxy_limit_and_leaves_the_pod_alone(sim_pool, ordinary_user, settings):
    sim_pool.sim.set_faults([{"kind": "proxy_timeout"}])  # every page, for ever
    job = submit(ordinary_user, {"note.png": image_bytes(["a note"])}, pool_key=sim_pool.pool.key)
    split(job)

    run_dispatch_loop(sim_pool.pool)

    page = Page.objects.get(job=job)
    assert (page.status, page.attempts) == (Page.Status.FAILED, settings.PAGE_MAX_ATTEMPTS)
    assert "RunPod's proxy" in page.error and "100 s" in page.error and "<html" not in page.error.lower()
    assert Job.objects.get(pk=job.pk).status == Job.Status.FAILED
    assert Pod.objects.get(pk=sim_pool.pod.pk).state == Pod.State.READY
