"""Faults during dispatch: a dispatcher killed with -9, a pod killed mid-page.
Every page ends exactly once, with one result."""

from __future__ import annotations

import hashlib
import signal
import socket
import subprocess
import sys
import uuid

import pytest
from django.conf import settings
from django.utils import timezone

from ocrjobs.models import Dispatcher, Document, Job, Page
from pods.models import Pod, Pool
from pods.providers.base import Offer, PodSpec
from pods.providers.runpod import RunPodProvider
from runpodsim import SimConfig, SimulatorThread
from runpodsim.config import GpuTypeConfig
from tests.assertions import assert_every_page_done_once
from tests.factories import blank_pdf_bytes
from tests.runpod import use_simulator
from tools.processes import REPO, child_env, wait_for

pytestmark = pytest.mark.e2e

DISPATCHER = """
import django, os, sys
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "fleetadmin.settings")
django.setup()
from ocrjobs.dispatch.loop import run_dispatcher
run_dispatcher(pool_id=int(sys.argv[1]))
"""


@pytest.fixture
def farm(monkeypatch, settings, transactional_db):
    config = SimConfig(api_key="k", boot_delay_s=0, model_load_s=0, page_latency_s=0.2, default_lanes=4,
                       gpu_types=[GpuTypeConfig(id="G", display_name="g", secure_price=1.0,
                                                capacity={"SECURE": {"DC": 4}})])  # fmt: skip
    with SimulatorThread(config) as sim:
        use_simulator(sim, monkeypatch, settings, api_key="k")
        yield sim


def _fleet(sim, pods: int, pages: int) -> tuple[Pool, Job, list[Pod]]:
    pool = Pool.objects.create(key=f"f{uuid.uuid4().hex[:6]}", provider="runpod", max_pods=pods, lanes_per_pod=4)
    provider = RunPodProvider(api_key="k", url_template=sim.pod_url_template)
    rows = []
    for n in range(pods):
        created = provider.create(PodSpec(name=f"fa-{pool.key}-{n}", lanes=4, offer=Offer("G", "SECURE", "DC"),
                                          image="img:1"))  # fmt: skip
        rows.append(Pod.objects.create(pool=pool, name=created.name, provider_id=created.provider_id, lanes=4,
                                       state=Pod.State.READY, base_url=f"{sim.url}/pods/{created.provider_id}"))  # fmt: skip
    content = blank_pdf_bytes(pages)
    (settings.MEDIA_ROOT / "d.pdf").write_bytes(content)
    job = Job.objects.create(pool=pool)
    document = Document.objects.create(job=job, position=0, name="d.pdf", kind="pdf", source="d.pdf", status="split",
                                       size_bytes=len(content), sha256=hashlib.sha256(content).hexdigest(),
                                       page_count=pages)  # fmt: skip
    Page.objects.bulk_create([Page(job=job, document=document, pool=pool, number=n)
                              for n in range(1, pages + 1)])  # fmt: skip
    return pool, job, rows


def _dispatcher(pool: Pool, tmp_path, **env) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", DISPATCHER, str(pool.pk)], cwd=REPO,
                            env=child_env(tmp_path, **env))  # fmt: skip


def test_a_dispatcher_killed_with_9_loses_no_page_and_writes_none_twice(farm, tmp_path, settings):
    settings.DISPATCHER_STALE_SECONDS = 2
    # 240 pages at 0.2 s on 8 lanes: seconds of work still to do once 20 are done.
    pool, job, _ = _fleet(farm, pods=2, pages=240)
    first = _dispatcher(pool, tmp_path, PAGE_CLAIM_SECONDS="3", DISPATCHER_STALE_SECONDS="2")

    def stopped_holding_pages() -> bool:
        """Mid-job, the dispatcher frozen (SIGSTOP): the pages it holds now are those it dies holding."""
        if job.pages.filter(status=Page.Status.DONE).count() < 20:
            return False
        first.send_signal(signal.SIGSTOP)
        if job.pages.filter(status=Page.Status.RUNNING).exists():
            return True
        first.send_signal(signal.SIGCONT)  # between two claims: let it run on
        return False

    try:
        wait_for(stopped_holding_pages, 60, "the first dispatcher never held pages with 20 done")
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    claimed = job.pages.filter(status=Page.Status.RUNNING).count()
    assert claimed > 0  # it died holding pages
    # Its heartbeat goes stale, then a successor may take the pool (the scaler tick would start it).
    wait_for(lambda: not Dispatcher.objects.live().filter(pool=pool).exists(), 30, "the dead dispatcher looks alive")
    second = _dispatcher(pool, tmp_path, PAGE_CLAIM_SECONDS="3", DISPATCHER_STALE_SECONDS="2")
    assert second.wait(timeout=120) == 0
    assert_every_page_done_once(job)


def test_a_pod_killed_mid_page_sends_its_pages_elsewhere_once(farm, tmp_path):
    # 400 pages at 0.2 s on 8 lanes: about 10 s of work, so that most of it is still to do when pod 0 goes.
    pages = 400
    pool, job, pods = _fleet(farm, pods=2, pages=pages)
    dispatcher = _dispatcher(pool, tmp_path)
    try:
        wait_for(lambda: job.pages.filter(status=Page.Status.DONE).count() >= 10, 60, "no page was done")
        RunPodProvider(api_key="k", url_template=farm.pod_url_template).terminate(pods[0].provider_id)
        killed = timezone.now()
        assert dispatcher.wait(timeout=120) == 0
    finally:
        if dispatcher.poll() is None:
            dispatcher.kill()
    # The precondition, stated: a page claimed after the kill was sent after it, pod 0 failing its share (a run
    # of failures drains it) and pod 1 doing all of them; more than half were.
    claimed_after = job.pages.filter(started_at__gt=killed).count()
    assert claimed_after > pages // 2, f"only {claimed_after} of {pages} pages were claimed after pod 0 was killed"
    assert_every_page_done_once(job)
    assert Pod.objects.get(pk=pods[0].pk).state == Pod.State.DRAINING  # failed pages drained it
    assert Page.objects.filter(job=job, pod=pods[0]).count() < Page.objects.filter(job=job, pod=pods[1]).count()


def test_a_pod_that_refuses_connections_spends_no_attempt_and_is_drained(farm, tmp_path):
    # 300 pages at 0.2 s on 4 lanes keep the dispatcher busy past the pod's first 10 s away.
    pool, job, pods = _fleet(farm, pods=2, pages=300)
    with socket.socket() as closed:  # a port that nothing listens on: every connection is refused
        closed.bind(("127.0.0.1", 0))
        dead_url = f"http://127.0.0.1:{closed.getsockname()[1]}"
    Pod.objects.filter(pk=pods[0].pk).update(base_url=dead_url)

    dispatcher = _dispatcher(pool, tmp_path)
    try:
        assert dispatcher.wait(timeout=120) == 0
    finally:
        if dispatcher.poll() is None:
            dispatcher.kill()

    assert_every_page_done_once(job)
    assert set(job.pages.values_list("attempts", flat=True)) == {1}  # a refused connection spent no attempt
    assert not job.pages.filter(pod=pods[0]).exists()
    dead = Pod.objects.get(pk=pods[0].pk)
    assert (dead.state, "refusing connections 2 times" in dead.error) == (Pod.State.DRAINING, True)
