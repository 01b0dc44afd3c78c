"""Faults in the processes while a job runs, on real daphne, qcluster and pods.

For each fault the same three things are checked:

- no page is lost or done twice: every page is DONE with its one result in its
  row (stored only under its current claim), and the job is done;
- no pod runs unaccounted: after a reconcile (which must find nothing to adopt
  or terminate), the provider's pods of this deployment are exactly the alive
  Pod rows;
- recovery needs no person: only the system's own nudges and schedules. Where
  the system waits for its one-minute scaler schedule, the test runs that tick
  once itself (``pods.tasks.scaler_tick``) and says so at that line; that is
  the only stand-in.

The children run with short leases (claims 5 s, a dispatcher stale after 4 s)
so that a dead holder's pages come back within seconds. Simulator pods answer
a page in 0.3 s; only the pod-kill test needs tesseract.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil
import pytest
from django.conf import settings
from django.db import connection
from django.test import Client

from accounts.models import ApiToken
from ocrjobs.models import Dispatcher, Document, Job, Page
from pods.models import Pod, Pool
from pods.providers import get_provider
from pods.services import lifecycle, passes, reconcile
from pods.tasks import scaler_tick
from tests.assertions import assert_every_page_done_once
from tests.e2e.conftest import SIM_GPU, queues_of_its_own, simulator
from tests.factories import PAGES_TRUTH, blank_pdf_bytes, pdf_bytes
from tests.ocrjobs.helpers import tiff_bytes
from tools.processes import Process, child_env, start_front, start_workers, wait_for

pytestmark = pytest.mark.e2e

GUARD = 120  # seconds, against hangs only
LEASES = {"PAGE_CLAIM_SECONDS": "5", "DISPATCHER_STALE_SECONDS": "4", "Q_TIMEOUT": "30"}


# --- the system under test ------------------------------------------------------------------------


@dataclass
class System:
    env: dict[str, str]
    var_dir: Path
    front: Process
    url: str
    workers: Process
    headers: dict[str, str]
    old_fronts: list[Process] = field(default_factory=list)

    def logs(self) -> str:
        fronts = "\n".join(f"--- {p.log_path.name} ---\n{p.tail()}" for p in [*self.old_fronts, self.front])
        return f"{fronts}\n--- qcluster ---\n{self.workers.tail(120)}"

    def submit(self, files: dict[str, bytes], pool: Pool) -> Job:
        response = httpx.post(f"{self.url}/v1/jobs", headers=self.headers, data={"pool": pool.key},
                              files=[("files", (name, data)) for name, data in files.items()], timeout=30)  # fmt: skip
        assert response.status_code == 201, response.text
        return Job.objects.get(pk=response.json()["id"])

    def restart_front(self) -> None:
        self.old_fronts.append(self.front)
        log_dir = self.var_dir / f"front-{len(self.old_fronts)}"
        log_dir.mkdir()
        self.front, self.url = start_front(self.env, log_dir)

    def cluster(self) -> psutil.Process:
        return psutil.Process(self.workers.popen.pid)

    def cluster_pids(self) -> set[int]:
        """The qcluster's living descendants: sentinel, workers, monitor, pusher (zombies left out)."""
        living = set()
        for child in self.cluster().children(recursive=True):
            try:
                if child.status() != psutil.STATUS_ZOMBIE:
                    living.add(child.pid)
            except psutil.NoSuchProcess:
                pass
        return living


@pytest.fixture
def start_system(transactional_db, deployment, tmp_path, admin_user, monkeypatch, settings):
    """Start daphne and a qcluster on the test database, with a broker queue of their own."""
    # This process judges liveness and claims (and runs the stand-in tick) with the children's leases.
    settings.PAGE_CLAIM_SECONDS = float(LEASES["PAGE_CLAIM_SECONDS"])
    settings.DISPATCHER_STALE_SECONDS = float(LEASES["DISPATCHER_STALE_SECONDS"])
    # A cluster name of its own: on a Redis shared with other runs, nobody else takes these tasks.
    # Tasks this process enqueues (the stand-in tick) must be signed and queued the same way.
    cluster = queues_of_its_own(monkeypatch, "faults")
    systems: list[System] = []

    def start(**extra: str) -> System:
        var_dir = tmp_path / "var"
        var_dir.mkdir()
        env = child_env(var_dir, Q_WORKERS="3", Q_CLUSTER_NAME=cluster, SCALE_TARGET_SECONDS="2", **{**LEASES, **extra})
        workers = start_workers(env, var_dir)
        front, url = start_front(env, var_dir)
        token = ApiToken.issue(user=admin_user, name="faults", scopes=["submit"])[1]
        system = System(env, var_dir, front, url, workers, {"Authorization": f"Bearer {token}"})
        systems.append(system)
        return system

    yield start
    for system in systems:
        system.front.stop()
        system.workers.stop()
        for pod in Pod.objects.alive().select_related("pool"):
            lifecycle.pod_release_now(pod=pod, reason="test over")
        print(system.logs())


def sim_pool(**fields) -> Pool:
    config = {"image": "ghcr.io/example/fleetadmin-pod:1",
              "candidates": [{"gpu_types": [SIM_GPU], "cloud_type": "SECURE", "data_centers": ["DC-1"]}]}  # fmt: skip
    values = {"max_pods": 2, "lanes_per_pod": 2, "idle_seconds": 3600, **fields}
    return Pool.objects.create(key=f"sim{uuid.uuid4().hex[:5]}", provider="runpod", config=config, **values)


def frames(count: int) -> bytes:
    """A TIFF with ``count`` small pages: split fast, forwarded to simulator pods."""
    return tiff_bytes([(64, 64)] * count)


def wait_until_finished(system: System, *jobs: Job) -> None:
    """Until the jobs are finished; fails once GUARD seconds pass with no page done or split (a hang).
    A guard that counts from the start failed a job still moving on a loaded machine (30,000 pages
    split and read on PostgreSQL at load 24 took more than 120 s)."""
    last, deadline = None, time.monotonic() + GUARD
    while True:
        for job in jobs:
            job.refresh_from_db()
        if all(job.is_finished for job in jobs):
            return
        progress = [(job.pages.count(), pages_done(job)) for job in jobs]
        if progress != last:
            last, deadline = progress, time.monotonic() + GUARD
        assert time.monotonic() < deadline, f"jobs {[j.pk for j in jobs]} stopped moving: {last}\n{system.logs()}"
        time.sleep(0.2)


def pages_done(job: Job) -> int:
    return job.pages.filter(status=Page.Status.DONE).count()


# --- the invariants ---------------------------------------------------------------------------------


def assert_no_pod_unaccounted(provider_name: str) -> None:
    booting = Pod.objects.filter(pool__provider=provider_name, state=Pod.State.BOOTING)
    wait_for(lambda: not booting.exists(), 60,
             lambda: f"a boot never ended: {list(booting.values('name', 'provider_id', 'created_at'))}")  # fmt: skip
    # Pods that ended are terminated at the provider by the workers' passes. The workers' clock asks
    # for a pass while a terminate is due; until it lands, this asks where that clock would have.
    ending = Pod.objects.filter(pool__provider=provider_name, terminate_pending=True)

    def terminated() -> bool:
        passes.pass_request()
        return not ending.exists()

    wait_for(terminated, 60, lambda: f"terminates never confirmed: {list(ending.values('name', 'step_at'))}")
    settings.RECONCILE_GRACE_SECONDS = 0
    result = reconcile.reconcile(provider_name=provider_name)
    assert (result.adopted, result.terminated) == ([], []), result
    at_provider = {p.provider_id for p in get_provider(provider_name).list(prefix=f"{settings.DEPLOYMENT_PREFIX}-")}
    alive = set(Pod.objects.alive().filter(pool__provider=provider_name).values_list("provider_id", flat=True))
    assert at_provider == alive


# --- kill -9 of a qcluster worker -------------------------------------------------------------------


def test_a_qcluster_worker_killed_with_9_mid_job_loses_no_page_and_does_none_twice(sim, start_system):
    system = start_system()
    pool = sim_pool()
    job = system.submit({"scan.tif": frames(60)}, pool)

    def dispatching_stopped_holding_pages():
        """Mid-job, the worker running the dispatch loop frozen (SIGSTOP): the pages it holds now are
        those it dies holding."""
        dispatcher = pages_done(job) >= 5 and Dispatcher.objects.live().filter(pool=pool).first()
        if not dispatcher:
            return None
        os.kill(dispatcher.pid, signal.SIGSTOP)
        if job.pages.filter(status=Page.Status.RUNNING, claim_token=dispatcher.token).exists():
            return dispatcher
        os.kill(dispatcher.pid, signal.SIGCONT)  # between two claims: let it run on
        return None

    dispatcher = wait_for(dispatching_stopped_holding_pages, GUARD, lambda: f"no page was done\n{system.logs()}")
    # The worker running the dispatch loop is one of the cluster's own processes.
    before = system.cluster_pids()
    assert dispatcher.pid in before

    os.kill(dispatcher.pid, signal.SIGKILL)

    held = job.pages.filter(status=Page.Status.RUNNING, claim_token=dispatcher.token).count()
    assert held > 0  # it died holding pages
    assert pages_done(job) < 60

    def replaced() -> bool:
        living = system.cluster_pids()
        return dispatcher.pid not in living and bool(living - before)

    # django-q2's guard reaps the dead worker and starts a new one by itself.
    wait_for(replaced, 30, lambda: f"the dead worker was not replaced\n{system.logs()}")
    # The dead loop's heartbeat goes stale; its claims expire and its pages wait again.
    wait_for(lambda: job.is_finished or not Dispatcher.objects.live().filter(pool=pool).exists(), 30, "still live")
    # STAND-IN: the scaler's one-minute schedule would start a successor dispatcher; run that tick once now.
    scaler_tick(pool.pk)

    wait_until_finished(system, job)
    assert_every_page_done_once(job)
    assert_no_pod_unaccounted("runpod")


# --- kill -9 of the front ---------------------------------------------------------------------------


def test_the_front_killed_with_9_mid_job_loses_nothing_and_a_new_front_answers(sim, start_system):
    system = start_system()
    pool = sim_pool()
    job = system.submit({"scan.tif": frames(40)}, pool)
    wait_for(lambda: pages_done(job) >= 5, GUARD, lambda: f"no page was done\n{system.logs()}")

    system.front.popen.send_signal(signal.SIGKILL)
    system.front.popen.wait(timeout=10)

    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{system.url}/healthz", timeout=2)
    wait_until_finished(system, job)  # the workers need no front
    assert_every_page_done_once(job)

    system.restart_front()
    assert httpx.get(f"{system.url}/healthz", timeout=5).json() == {"status": "ok"}
    answer = httpx.get(f"{system.url}/v1/jobs/{job.pk}", headers=system.headers, timeout=10)
    assert answer.status_code == 200
    assert answer.json()["status"] == "done" and answer.json()["pages"]["done"] == 40
    assert_no_pod_unaccounted("runpod")


# --- kill -9 of a pod mid-page ------------------------------------------------------------------------


def test_a_local_pod_killed_with_9_mid_page_has_its_pages_done_once_on_another_and_is_marked_lost(
    start_system, local_pool
):
    Pool.objects.filter(pk=local_pool.pk).update(min_pods=2, max_pods=2, lanes_per_pod=1, idle_seconds=3600)
    system = start_system()
    # STAND-IN: the scaler's one-minute schedule would boot the pool's two min_pods; run that tick once now.
    scaler_tick(local_pool.pk)
    wait_for(
        lambda: Pod.objects.filter(pool=local_pool, state=Pod.State.READY).count() >= 2,
        GUARD,
        lambda: f"two pods never ready\n{system.logs()}",
    )
    # Both pods frozen (SIGSTOP) before any page exists: a page forwarded to one of them is surely
    # mid-page there when it dies, never answered, however late this process looks (under load a
    # pod stopped after its answer left, or a job over before it was looked at, made this flaky).
    pods = list(Pod.objects.filter(pool=local_pool, state=Pod.State.READY))
    for pod in pods:
        os.kill(int(pod.provider_id), signal.SIGSTOP)
    try:
        job = system.submit({"report.pdf": pdf_bytes(PAGES_TRUTH * 2)}, local_pool)
        page = wait_for(
            lambda: job.pages.filter(status=Page.Status.RUNNING, pod__in=pods).select_related("pod").first(),
            GUARD,
            lambda: f"no page was forwarded to a pod\n{system.logs()}",
        )
        victim = page.pod
        os.kill(int(victim.provider_id), signal.SIGKILL)
    finally:
        for pod in pods:
            try:
                os.kill(int(pod.provider_id), signal.SIGCONT)  # the other pod reads on
            except ProcessLookupError:
                pass  # the victim

    wait_until_finished(system, job)
    assert_every_page_done_once(job)
    page.refresh_from_db()
    assert page.pod_id != victim.pk  # the page it was reading was done by another pod (the other, or its replacement)

    def lost():
        victim.refresh_from_db()
        return victim.state == Pod.State.LOST

    # Ticks nudged by the dispatcher reconcile; if none came, this stands in for the one-minute schedule.
    try:
        wait_for(lost, 15, "")
    except AssertionError:
        scaler_tick(local_pool.pk)  # STAND-IN for the scaler's one-minute schedule, once
    assert lost(), f"{victim.state}: {victim.error}"
    assert "no longer has this pod" in victim.error
    assert_no_pod_unaccounted("local")


# --- PostgreSQL dropping every connection -------------------------------------------------------------


def terminate_other_backends() -> int:
    """What clients see when PostgreSQL restarts: every connection to this database dropped."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        return cursor.fetchone()[0]


@pytest.mark.skipif(not os.environ.get("DATABASE_URL"), reason="PostgreSQL only (DATABASE_URL)")
def test_postgresql_dropping_every_connection_mid_job_loses_no_page_and_does_none_twice(sim, start_system):
    system = start_system()
    pool = sim_pool()
    job = system.submit({"scan.tif": frames(60)}, pool)
    wait_for(lambda: pages_done(job) >= 5, GUARD, lambda: f"no page was done\n{system.logs()}")

    dropped = terminate_other_backends()

    assert dropped >= 4  # the front's, the cluster's, the workers' and the dispatch loop's connections
    assert pages_done(job) < 60
    # A dispatch loop whose connection dropped ends; its claims expire and its pages wait again.
    wait_for(lambda: job.is_finished or not Dispatcher.objects.live().filter(pool=pool).exists(), 30, "still live")
    # STAND-IN: the scaler's one-minute schedule would start a successor dispatcher; run that tick once now.
    scaler_tick(pool.pk)
    wait_until_finished(system, job)
    assert_every_page_done_once(job)
    # The front answers again from the database.
    answers = [httpx.get(f"{system.url}/v1/jobs/{job.pk}", headers=system.headers, timeout=10) for _ in range(3)]
    assert [a.status_code for a in answers] == [200, 200, 200]
    assert_no_pod_unaccounted("runpod")


# --- Redis going away and coming back --------------------------------------------------------------------


def _redis():
    import redis

    return redis.from_url(os.environ["REDIS_URL"])


def drop_redis_clients(system: System) -> int:
    """Close, at the server, every Redis connection of this system's processes (front, cluster,
    workers): from their side Redis went away. Other users of the shared server are left alone."""
    port = int(re.search(r":(\d+)", os.environ["REDIS_URL"].split("@")[-1]).group(1))
    processes = [system.front.popen.pid, system.workers.popen.pid]
    processes += sorted(system.cluster_pids())
    addresses = set()
    for pid in processes:
        try:
            sockets = psutil.Process(pid).net_connections(kind="tcp")
        except psutil.NoSuchProcess:
            continue
        addresses |= {f"{s.laddr.ip}:{s.laddr.port}" for s in sockets if s.raddr and s.raddr.port == port}
    client = _redis()
    return sum(client.client_kill_filter(_id=None, addr=address) for address in sorted(addresses))


@pytest.mark.skipif(not os.environ.get("REDIS_URL"), reason="Redis only (REDIS_URL)")
def test_redis_dropping_every_client_and_stalling_mid_job_loses_no_page_and_recovers(sim, start_system, admin_user):
    from tests.pods.test_consumers import collect

    system = start_system()
    pool = sim_pool()
    job = system.submit({"scan.tif": frames(40)}, pool)
    wait_for(lambda: pages_done(job) >= 5, GUARD, lambda: f"no page was done\n{system.logs()}")

    assert drop_redis_clients(system) >= 2  # at least the cluster's broker and the pusher's
    # Unresponsive for 3 s (DEBUG SLEEP is disabled on this server; CLIENT PAUSE stalls every client the same way).
    _redis().execute_command("CLIENT", "PAUSE", 3000, "ALL")
    # A job submitted now goes through the broker after the drop: its split tasks must still run.
    later = system.submit({"later.tif": frames(10)}, pool)
    drop_redis_clients(system)

    wait_until_finished(system, job, later)
    assert_every_page_done_once(job)
    assert_every_page_done_once(later)

    # The front's cache and channel layer reconnected too: the dashboard renders and its websocket talks.
    browser = Client()
    browser.force_login(admin_user)
    cookie = browser.cookies["sessionid"].value
    page = httpx.get(f"{system.url}/", cookies={"sessionid": cookie}, timeout=10)
    assert page.status_code == 200
    received, code = asyncio.run(collect(system.url, cookie, 3))
    assert received and code is None
    assert_no_pod_unaccounted("runpod")


# --- kill -9 of the whole cluster mid split and mid boot ------------------------------------------


@pytest.fixture
def slow_boot_sim(monkeypatch, settings):
    """Pods take seconds to come up: a boot is still waiting for its pod when the cluster dies."""
    yield from simulator(monkeypatch, settings, boot_delay_s=5.0, page_latency_s=0.002)


def kill_tree(root: psutil.Process) -> None:
    family = [root, *root.children(recursive=True)]
    for member in family:
        try:
            member.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(family, timeout=10)


def test_the_cluster_killed_with_9_mid_split_and_mid_boot_has_both_sent_again_and_done_once(
    slow_boot_sim, start_system, settings
):
    # Short task leases, so that the dead split's row is seen as lost within seconds.
    leases = {"TASK_LEASE_SECONDS": "2", "TASK_START_GRACE_SECONDS": "10"}
    # The resumed split's time limit is not what this test is about: on PostgreSQL under load 20 the
    # rest of the 30,000 rows took over the other tests' 30 s, the split was ended by its limit, and
    # only the one-minute schedule sent it again ("jobs did not finish"). Its own limit, then.
    leases["Q_TIMEOUT"] = "300"
    settings.TASK_LEASE_SECONDS, settings.TASK_START_GRACE_SECONDS = 2.0, 10.0
    # A split renders nothing now: it is the page rows, a batch at a time, a few milliseconds each.
    # A document of 30,000 pages (a limit raised for it) takes seconds to split, long enough to be
    # caught in the middle; the pod reads its pages in a few milliseconds each.
    frame_count = 30_000
    system = start_system(**leases, OCR_MAX_PAGES_PER_DOCUMENT=str(frame_count))
    pool = sim_pool(max_pods=1, lanes_per_pod=16)
    job = system.submit({"scan.pdf": blank_pdf_bytes(frame_count)}, pool)
    document = job.documents.get()
    splitting = Document.objects.filter(pk=document.pk, status=Document.Status.PENDING).exclude(task_lease_token="")
    # Created, waiting until it runs: a row that passes advance (no worker waits on it between steps).
    booting = Pod.objects.filter(pool=pool, state=Pod.State.BOOTING, boot_stage=Pod.BootStage.RUNNING)

    def mid_split_and_mid_boot() -> bool:
        return splitting.exists() and job.pages.exists() and booting.exists()

    wait_for(mid_split_and_mid_boot, GUARD, lambda: f"never mid split and mid boot\n{system.logs()}", interval=0.05)
    kill_tree(system.cluster())  # every worker, mid task (a split, maybe a pass): on Redis their tasks are gone

    split_so_far = job.pages.count()
    assert 0 < split_so_far < frame_count and splitting.exists() and booting.exists()
    pod = booting.get()
    log_dir = system.var_dir / "qcluster-2"
    log_dir.mkdir()
    system.workers = start_workers(system.env, log_dir)
    # The dead split's lease lapses within 2 s. A pass killed mid-step leaves its own lease and its
    # step's (PASS_LEASE_SECONDS, BOOT_STEP_LEASE_SECONDS): STAND-IN, they are aged rather than waited for.
    wait_for(lambda: not leases_held(document), 30, "the dead split's lease never lapsed")
    lapse_pass_leases(pod)
    # STAND-IN: the scaler's one-minute schedule would send the split again and ask for a pass; run that tick once now.
    scaler_tick(pool.pk)

    wait_until_finished(system, job)
    assert_every_page_done_once(job)
    assert job.pages.count() == frame_count
    pod.refresh_from_db()
    assert pod.state == Pod.State.READY  # the boot went on with the pod it had created
    assert list(pod.boot_attempts.values_list("outcome", flat=True)) == ["created"]  # one create, not two
    assert pool.pods.count() == 1
    assert_no_pod_unaccounted("runpod")


def leases_held(document) -> bool:
    from fleetadmin import leases

    return not leases.expired(Document.objects.filter(pk=document.pk)).exists()


def lapse_pass_leases(pod: Pod) -> None:
    from django.utils import timezone

    from pods.models import PassLease

    lapsed = timezone.now() - timezone.timedelta(seconds=1)
    Pod.objects.filter(pk=pod.pk).exclude(task_lease_until=None).update(task_lease_until=lapsed)
    PassLease.objects.exclude(task_lease_until=None).update(task_lease_until=lapsed)
