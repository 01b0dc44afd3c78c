"""Local pods belong to their host (fleetadmin/hosts.py): another host's reconcile, passes and
dispatchers leave them alone while their host reports; once it has been silent for
HOST_LOST_AFTER_SECONDS, whoever reconciles marks them lost and their pages wait again.

"Hosts" here are HOST_ID values of this one process, on one machine: the real local pod that host
A starts is a process host B can see, which is the harder case for B's reconcile."""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from fleetadmin.clusters import PassClock
from fleetadmin.hosts import host_report, hosts_silent
from fleetadmin.models import WorkerHost
from ocrjobs.dispatch.database import fleet
from ocrjobs.models import Document, Job, Page
from pods.models import Pod
from pods.providers.local import LocalProvider
from pods.services import boot, lifecycle, reconcile
from tests.pods.helpers import boot_until_settled


def _running_page(pool, pod: Pod) -> Page:
    job = Job.objects.create(pool=pool)
    document = Document.objects.create(job=job, position=0, name="d.png", kind="image", source="x", size_bytes=1,
                                       page_count=1)  # fmt: skip
    return Page.objects.create(job=job, document=document, pool=pool, number=1, status=Page.Status.RUNNING,
                               pod=pod, claim_token="t", attempts=1)  # fmt: skip


def test_a_local_pod_is_its_hosts_and_another_host_marks_it_lost_only_once_its_host_is_silent(
    local_pool, prefix, settings, transactional_db
):
    settings.HOST_ID = "host-a"
    settings.HOST_LOST_AFTER_SECONDS = 60.0
    host_report()
    pod = boot_until_settled(Pod.objects.create(pool=local_pool, name=f"{prefix}-local-a", lanes=1).pk)
    assert (pod.state, pod.host) == (Pod.State.READY, "host-a"), pod.error
    page = _running_page(local_pool, pod)

    settings.HOST_ID = "host-b"  # host B's turn: it sees A's process, but the pod is A's
    result = reconcile.reconcile(provider_name="local")
    assert (result.adopted, result.terminated, result.lost) == ([], [], [])
    assert Pod.objects.get(pk=pod.pk).state == Pod.State.READY
    assert LocalProvider().get(pod.provider_id) is not None
    assert fleet(pool_id=local_pool.pk)[0] == []  # B's dispatchers cannot reach A's loopback port

    WorkerHost.objects.filter(host="host-a").update(reported_at=timezone.now() - timedelta(seconds=61))
    result = reconcile.reconcile(provider_name="local")

    assert result.lost == [pod.name]
    pod.refresh_from_db()
    assert pod.state == Pod.State.LOST and "host-a stopped reporting" in pod.error
    page.refresh_from_db()
    assert (page.status, page.claim_token) == (Page.Status.PENDING, "")

    settings.HOST_ID = "host-a"  # its own host still reaches it
    assert [ready[0] for ready in fleet(pool_id=local_pool.pk)[0]] == []  # lost: no lanes anywhere


def test_another_hosts_booting_and_ending_local_pods_are_not_stepped_here(local_pool, settings):
    now = timezone.now()
    mine, theirs, anyones = (
        Pod.objects.create(pool=local_pool, name=f"fa-local-{n}", host=host, step_at=now - timedelta(seconds=1))
        for n, host in (("mine", "host-a"), ("theirs", "host-b"), ("new", ""))
    )
    Pod.objects.filter(pk__in=[mine.pk, theirs.pk]).update(provider_id="1")
    settings.HOST_ID = "host-a"

    assert set(boot.boots_due(now=now, limit=10)) == {mine.pk, anyones.pk}

    Pod.objects.all().update(state=Pod.State.TERMINATED, terminate_pending=True)
    assert set(lifecycle.terminations_due(now=now, limit=10)) == {mine.pk, anyones.pk}
    lifecycle.terminate_step(theirs.pk)  # asked anyway: its pid is host B's, not a process here
    assert Pod.objects.get(pk=theirs.pk).terminate_pending


def test_a_host_reports_from_the_workers_clock_and_is_silent_once_it_stops(db, settings):
    settings.HOST_ID = "host-a"
    settings.HOST_LOST_AFTER_SECONDS = 60.0

    PassClock()()

    row = WorkerHost.objects.get(host="host-a")
    assert hosts_silent({"host-a", "host-never"}) == {"host-never"}
    later = row.reported_at + timedelta(seconds=61)
    assert hosts_silent({"host-a"}, now=later) == {"host-a"}
