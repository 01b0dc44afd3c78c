"""A small fleet in the database, as the dashboard tests and the consumer tests see it."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal

from django.utils import timezone

from fleetadmin.models import LoopHeartbeat
from ocrjobs.models import Document, Job, Page
from pods.models import Alert, BootAttempt, CapacityVerdict, Pod, Pool


@dataclass
class Fleet:
    gpu: Pool
    ready: Pod
    booting: Pod
    failed: Pod
    terminated: Pod
    bobs_job: Job
    mallorys_job: Job
    admins_job: Job
    alert: Alert
    resolved: Alert
    verdict: CapacityVerdict
    heartbeat: LoopHeartbeat


def make_job(owner, pool: Pool, *, pages: int = 4, done: int = 0, status: str = Job.Status.RUNNING, pod=None) -> Job:
    now = timezone.now()
    job = Job.objects.create(owner=owner, pool=pool, status=status)
    document = Document.objects.create(
        job=job,
        position=0,
        name=f"report-{owner.username}.pdf",
        kind="pdf",
        source="x.pdf",
        size_bytes=1,
        page_count=pages,
    )
    for number in range(1, pages + 1):
        finished = number <= done
        Page.objects.create(
            job=job, document=document, pool=pool, number=number,
            status=Page.Status.DONE if finished else Page.Status.PENDING,
            pod=pod if finished else None,
            started_at=now - timedelta(seconds=100) if finished else None,
            finished_at=now - timedelta(seconds=10) if finished else None,
            seconds=90.0 if finished else None,
        )  # fmt: skip
    return job


def make_fleet(*, admin, bob, mallory) -> Fleet:
    now = timezone.now()
    gpu = Pool.objects.create(key="gpu", name="GPU pool", provider="runpod", max_pods=8, lanes_per_pod=4)
    ready = Pod.objects.create(
        pool=gpu, name="fa-gpu-ready1", provider_id="rp-1", state=Pod.State.READY, lanes=4, gpu_type="NVIDIA A40",
        cloud_type="SECURE", data_center="EU-RO-1", cost_per_hr=Decimal("0.44"),
        billed_from=now - timedelta(minutes=30), ready_at=now - timedelta(minutes=28), created_at=now - timedelta(minutes=30),
    )  # fmt: skip
    booting = Pod.objects.create(
        pool=gpu, name="fa-gpu-boot2", provider_id="rp-2", state=Pod.State.BOOTING, lanes=4, gpu_type="NVIDIA L4",
        cloud_type="COMMUNITY", data_center="US-KS-2", cost_per_hr=Decimal("0.24"), billed_from=now - timedelta(minutes=1),
    )  # fmt: skip
    failed = Pod.objects.create(
        pool=gpu, name="fa-gpu-failed3", state=Pod.State.FAILED, lanes=4, gpu_type="NVIDIA A100",
        ended_at=now - timedelta(minutes=5), error="model never loaded",
    )  # fmt: skip
    terminated = Pod.objects.create(
        pool=gpu, name="fa-gpu-gone4", provider_id="rp-4", state=Pod.State.TERMINATED, lanes=4, gpu_type="NVIDIA A40",
        cost_per_hr=Decimal("0.44"), billed_from=now - timedelta(hours=2), ended_at=now - timedelta(hours=1, minutes=30),
    )  # fmt: skip
    BootAttempt.objects.create(pod=ready, candidate="runpod|NVIDIA A40|SECURE|EU-RO-1", outcome="created", seconds=3.2)
    BootAttempt.objects.create(
        pod=failed, candidate="runpod|NVIDIA A100|SECURE|*", outcome="no_capacity", error="no instances available"
    )
    bobs_job = make_job(bob, gpu, pages=4, done=2, pod=ready)
    mallorys_job = make_job(mallory, gpu, pages=3, done=0)
    admins_job = make_job(admin, gpu, pages=2, done=2, status=Job.Status.DONE, pod=ready)
    alert = Alert.objects.create(pool=gpu, kind=Alert.Kind.STALL, message="pages wait while lanes are free")
    resolved = Alert.objects.create(pool=gpu, kind=Alert.Kind.BUDGET, message="old budget alert", resolved_at=now)
    verdict = CapacityVerdict.objects.create(
        key="runpod|NVIDIA A100|SECURE|*", blocked_until=now + timedelta(seconds=75), reason="no instances available"
    )
    heartbeat = LoopHeartbeat.objects.create(
        name="front", kind="front", host="web-1", pid=4242, lag_s=0.0042, worst_lag_s=0.31, stalls=2, blocked_s=0.9
    )
    return Fleet(gpu, ready, booting, failed, terminated, bobs_job, mallorys_job, admins_job, alert, resolved, verdict,
                 heartbeat)  # fmt: skip
