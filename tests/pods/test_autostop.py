"""Autostop (issue 39, invariant 21): a pod the control plane has not spoken to for its pool's
interval stops itself; while the control plane runs, keepalives keep it up; and when the control
plane comes back, such a stop is the pod's end, not a failure: ended at the moment it stopped,
its pages in flight waiting again with their attempts given back, no failure on its GPU type."""

from __future__ import annotations

import time
from datetime import timedelta
from io import StringIO

import pytest
from django.utils import timezone

from ocrjobs.models import Page
from pods.management.commands import up
from pods.models import CapacityVerdict, Pod, Pool
from pods.providers.local import LocalProvider
from pods.providers.runpod import RunPodProvider
from pods.serializers import pool_dict
from pods.services import autostop, preemption, reconcile
from pods.services.lifecycle import pod_release, pod_release_now
from tests.pods.helpers import boot_until_settled, new_pod, terminate_what_ended
from tests.pods.test_interruptible import pages_on, spot_pool, spot_sim  # noqa: F401 (a fixture)

HANG_GUARD = 60.0  # against hangs only: nothing here asserts how long anything takes


def _sim_pod(sim, provider_id: str) -> dict:
    return next(p for p in sim.pods() if p["id"] == provider_id)


def _until(condition, what: str) -> None:
    deadline = time.monotonic() + HANG_GUARD
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def _ready(pool: Pool) -> Pod:
    pod = boot_until_settled(new_pod(pool).pk)
    assert pod.state == Pod.State.READY, pod.error
    return pod


def _page_running_on(pod: Pod) -> Page:
    (page,) = pages_on(pod, 1)
    Page.objects.filter(pk=page.pk).update(status=Page.Status.RUNNING, pod=pod, attempts=1, claim_token="c",
                                           claim_expires_at=timezone.now() + timedelta(minutes=5))  # fmt: skip
    return page


def test_a_pod_is_booted_with_its_pools_interval_and_spoken_to_at_a_third_of_it(sim, pool):
    Pool.objects.filter(pk=pool.pk).update(autostop_seconds=900)
    pod = _ready(pool)

    assert "AUTOSTOP_SECONDS" in _sim_pod(sim, pod.provider_id)["create_settings"]["env_names"]
    assert pod.contacted_at is not None
    assert pod.keepalive_at - pod.contacted_at == timedelta(seconds=300)
    assert autostop.keepalives_due(now=pod.keepalive_at, limit=10) == [pod.pk]
    assert autostop.keepalives_due(now=pod.keepalive_at - timedelta(seconds=1), limit=10) == []


def test_keepalives_keep_a_pod_up_while_the_control_plane_runs(sim, pool):
    Pool.objects.filter(pk=pool.pk).update(autostop_seconds=3)  # a keepalive each second
    pod = _ready(pool)

    until = time.monotonic() + 9.0  # three intervals, each step taken as a pass would when due
    while time.monotonic() < until:
        for pod_id in autostop.keepalives_due(now=timezone.now(), limit=10):
            autostop.keepalive_step(pod_id)
        time.sleep(0.1)

    assert _sim_pod(sim, pod.provider_id)["billing"] is True
    result = reconcile.reconcile(provider_name="runpod")
    assert result.autostopped == [] and result.lost == []
    pod.refresh_from_db()
    assert pod.state == Pod.State.READY and pod.contacted_at > pod.ready_at


def test_a_pod_left_alone_stops_itself_and_reconcile_ends_it_with_nothing_lost(sim, pool):
    Pool.objects.filter(pk=pool.pk).update(autostop_seconds=2)
    pod = _ready(pool)
    page = _page_running_on(pod)

    # Every control-plane process is gone: nobody speaks to the pod.
    _until(lambda: not _sim_pod(sim, pod.provider_id)["billing"], "the pod never stopped itself")

    result = reconcile.reconcile(provider_name="runpod")  # the control plane is back
    assert result.autostopped == [pod.name]
    assert result.lost == [] and result.preempted == []
    pod.refresh_from_db()
    assert pod.state == Pod.State.TERMINATED and pod.error.startswith("autostopped")
    # Billed until it stopped, not until someone noticed.
    assert pod.ended_at == autostop.last_spoken_to(pod) + timedelta(seconds=2)
    page.refresh_from_db()
    assert (page.status, page.attempts, page.pod_id) == (Page.Status.PENDING, 0, pod.pk)
    # No verdict on its GPU type: the next boot may rent the same again.
    assert not CapacityVerdict.objects.filter(key__contains=pod.gpu_type, blocked_until__gt=timezone.now()).exists()
    assert Pod.objects.filter(state=Pod.State.FAILED).count() == 0
    # Its EXITED remains are terminated at the provider, as any ended pod's.
    assert terminate_what_ended() == 1
    assert RunPodProvider().get(pod.provider_id) is None


def test_a_pod_that_vanishes_while_spoken_to_is_lost_not_autostopped(sim, pool):
    pod = _ready(pool)  # the default interval: the control plane spoke to it moments ago
    RunPodProvider().terminate(pod.provider_id)  # gone behind our back

    result = reconcile.reconcile(provider_name="runpod")

    assert result.lost == [pod.name] and result.autostopped == []


def test_the_interval_is_validated_and_shown_with_the_pool(db):
    pool = Pool(key="p", provider="local", autostop_seconds=5)
    with pytest.raises(Exception, match="autostop_seconds"):
        pool.full_clean()
    pool.autostop_seconds = 600
    pool.full_clean()
    assert pool_dict(pool)["autostop_seconds"] == 600


@pytest.mark.once_sqlite
def test_a_local_pod_left_alone_exits_and_reconcile_ends_it_as_its_end(db, prefix):
    pool = Pool.objects.create(key="alone", provider="local", max_pods=1, autostop_seconds=3)
    pod = _ready(pool)
    provider = LocalProvider()

    _until(lambda: provider.get(pod.provider_id) is None, "the local pod never stopped itself")

    result = reconcile.reconcile(provider_name="local")
    assert result.autostopped == [pod.name] and result.lost == []
    pod.refresh_from_db()
    assert pod.state == Pod.State.TERMINATED and pod.error.startswith("autostopped")


def test_up_lists_the_paid_pods_still_up_when_it_stops(sim, pool):
    up_pod, released = _ready(pool), _ready(pool)
    pod_release(pod=released, reason="shed")  # ended here; no pass has terminated it yet
    local = Pool.objects.create(key="here", provider="local")
    Pod.objects.create(pool=local, name="local-one", provider_id="1", state=Pod.State.READY)  # free: not listed

    out, err = StringIO(), StringIO()
    up.Command(stdout=out, stderr=err).report_paid_pods()

    lines = err.getvalue().splitlines()
    assert lines[0].endswith("2 paid pod(s) still up, billing until they stop themselves:")
    assert {line.split()[0] for line in lines[1:3]} == {up_pod.name, released.name}
    assert "local-one" not in err.getvalue()
    assert "ended, terminate not confirmed" in err.getvalue()

    terminate_what_ended()
    pod_release_now(pod=up_pod, reason="done")
    out, err = StringIO(), StringIO()
    up.Command(stdout=out, stderr=err).report_paid_pods()
    assert out.getvalue().strip() == "no paid pods are up." and err.getvalue() == ""


def test_an_interruptible_pod_that_stopped_itself_is_not_counted_as_preempted(spot_sim, db):  # noqa: F811
    pool = spot_pool()
    Pool.objects.filter(pk=pool.pk).update(autostop_seconds=2)
    pod = _ready(pool)
    assert pod.interruptible
    _until(lambda: not _sim_pod(spot_sim, pod.provider_id)["billing"], "the pod never stopped itself")

    # What the dispatcher asks when a pod stops answering it (the control plane just came back).
    seen = preemption.provider_pod("runpod", pod.provider_id)
    assert seen is not None and seen.stopped
    assert preemption.pod_preempted_if_stopped(pod_id=pod.pk, seen=seen)  # ended: it leaves the lanes

    pod.refresh_from_db()
    assert pod.state == Pod.State.TERMINATED and pod.error.startswith("autostopped")
    assert pod.preempted_at is None
    assert not CapacityVerdict.objects.filter(key__contains=pod.gpu_type, blocked_until__gt=timezone.now()).exists()


def test_the_admin_edits_the_interval_and_refuses_one_too_short_for_a_worker_restart(client, admin_user):
    pool = Pool.objects.create(key="edited", provider="local")
    client.force_login(admin_user)
    form = client.get(f"/admin/pods/pool/{pool.pk}/change/").context["adminform"].form
    data = {name: form[name].value() for name in form.fields if form[name].value() is not None}
    data.update(config="{}")

    refused = client.post(f"/admin/pods/pool/{pool.pk}/change/", {**data, "autostop_seconds": 5})
    accepted = client.post(f"/admin/pods/pool/{pool.pk}/change/", {**data, "autostop_seconds": 1200})

    assert refused.status_code == 200 and "autostop_seconds" in refused.context["adminform"].form.errors
    assert accepted.status_code == 302, accepted.content.decode()[:2000]
    pool.refresh_from_db()
    assert pool.autostop_seconds == 1200


def test_a_running_pod_keeps_the_interval_it_was_booted_with_when_its_pool_changes(sim, pool):
    Pool.objects.filter(pk=pool.pk).update(autostop_seconds=300)
    pod = _ready(pool)
    Pool.objects.filter(pk=pool.pk).update(autostop_seconds=7200)  # longer: spoken to every 40 min
    pod = Pod.objects.select_related("pool").get(pk=pod.pk)

    assert pod.autostop == 300
    # Still spoken to at a third of the 300 s it stops after, not of the pool's new 7200 s.
    assert autostop.keepalive_period(pod) == timedelta(seconds=100)
    assert not autostop.autostop_expired(pod, now=autostop.last_spoken_to(pod) + timedelta(seconds=299))
    assert autostop.autostop_expired(pod, now=autostop.last_spoken_to(pod) + timedelta(seconds=300))
