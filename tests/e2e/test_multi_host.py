"""Any host serves any job (DESIGN invariant 16; issue 12 item 4), in the scaled-out setup: two
worker hosts (``manage.py workers`` each, with a var directory, a MEDIA_ROOT and a HOST_ID of its
own), two fronts (daphne, one per host), one real S3 server over HTTP (``rclone serve s3``, started
here) for the documents, all sharing PostgreSQL and Redis. Pods are the RunPod simulator's, which
every host reaches; each simulated page's text names the SHA-1 of the bytes it was sent.

Runs only in CI's PostgreSQL + Redis run (DATABASE_URL and REDIS_URL set): on the embedded SQLite
several hosts cannot share a database.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil
import pytest

from accounts.models import ApiToken
from ocrjobs.models import Dispatcher, Job, Page
from pods.models import Pod
from pods.services import lifecycle
from pods.tasks import scaler_tick
from tests.assertions import assert_every_page_done_once
from tests.e2e.conftest import queues_of_its_own
from tests.e2e.test_process_faults import GUARD, LEASES, frames, kill_tree, sim_pool
from tests.factories import PAGES_TRUTH, pdf_bytes
from tests.ocrjobs.helpers import files_under
from tools.processes import Process, child_env, start_front, start_s3_server, start_workers, wait_for

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        not (os.environ.get("DATABASE_URL") and os.environ.get("REDIS_URL")),
        reason="several hosts share PostgreSQL and Redis (CI's scaled-out run)",
    ),
]


@dataclass
class Host:
    name: str
    env: dict[str, str]
    var_dir: Path
    media: Path
    front: Process | None = None
    url: str = ""
    workers: Process | None = None
    started: list[Process] = field(default_factory=list)

    def start_front(self) -> None:
        self.front, self.url = start_front(self.env, self.var_dir, name=f"daphne-{self.name}")
        self.started.append(self.front)

    def start_workers(self) -> None:
        self.workers = start_workers(self.env, self.var_dir, name=f"workers-{self.name}")
        self.started.append(self.workers)

    def logs(self) -> str:
        return "\n".join(f"--- {p.log_path.name} ---\n{p.tail(60)}" for p in self.started)


@dataclass
class Cluster:
    a: Host
    b: Host
    bucket: Path
    headers: dict[str, str]

    def logs(self) -> str:
        return f"{self.a.logs()}\n{self.b.logs()}"

    def submit(self, host: Host, files: dict[str, bytes], pool) -> Job:
        response = httpx.post(f"{host.url}/v1/jobs", headers=self.headers, data={"pool": pool.key},
                              files=[("files", (name, data)) for name, data in files.items()], timeout=60)  # fmt: skip
        assert response.status_code == 201, response.text
        return Job.objects.get(pk=response.json()["id"])

    def wait_until_finished(self, job: Job) -> None:
        def finished() -> bool:
            job.refresh_from_db()
            return job.is_finished

        wait_for(finished, GUARD, lambda: f"job {job.pk} did not finish\n{self.logs()}")


@pytest.fixture
def cluster(sim, transactional_db, deployment, tmp_path, admin_user, monkeypatch, settings):
    settings.PAGE_CLAIM_SECONDS = float(LEASES["PAGE_CLAIM_SECONDS"])
    settings.DISPATCHER_STALE_SECONDS = float(LEASES["DISPATCHER_STALE_SECONDS"])
    # Queues of their own on the shared Redis; the stand-in tick below enqueues on them too.
    name = queues_of_its_own(monkeypatch, "hosts")
    s3, s3_env = start_s3_server(tmp_path / "s3", tmp_path)
    hosts = []
    for host in ("host-a", "host-b"):
        var_dir = tmp_path / host
        media = var_dir / "media"
        media.mkdir(parents=True)
        env = child_env(var_dir, MEDIA_ROOT=str(media), HOST_ID=host, Q_WORKERS="2", Q_CLUSTER_NAME=name,
                        SCALE_TARGET_SECONDS="2", **LEASES, **s3_env)  # fmt: skip
        hosts.append(Host(host, env, var_dir, media))
    token = ApiToken.issue(user=admin_user, name="hosts", scopes=["submit", "read"])[1]
    system = Cluster(*hosts, bucket=tmp_path / "s3" / s3_env["STORAGE_S3_BUCKET"],
                     headers={"Authorization": f"Bearer {token}"})  # fmt: skip
    yield system
    for host in hosts:
        for process in reversed(host.started):
            process.stop()
    for pod in Pod.objects.alive().select_related("pool"):
        lifecycle.pod_release_now(pod=pod, reason="test over")
    s3.stop()
    print(system.logs())


def test_a_job_submitted_on_front_a_is_split_and_dispatched_by_host_b_and_read_from_front_b(cluster):
    cluster.a.start_front()
    cluster.b.start_front()
    cluster.b.start_workers()  # host A runs no workers: whatever splits and dispatches is host B
    pool = sim_pool()

    job = cluster.submit(cluster.a, {"report.pdf": pdf_bytes(PAGES_TRUTH[:2]), "scan.tif": frames(3)}, pool)
    cluster.wait_until_finished(job)

    assert_every_page_done_once(job, pages=5)
    assert set(Dispatcher.objects.filter(pool=pool).values_list("host", flat=True)) == {"host-b"}
    # Documents are in the S3 server, on no host's disk.
    for document in job.documents.all():
        assert (cluster.bucket / document.source).is_file()
    assert files_under(cluster.a.media) == [] and files_under(cluster.b.media) == []
    # Each document was read from S3 by host B's dispatcher and sent to the pod, which checks its
    # bytes against the hash it is named by and names each page by that hash and its number.
    pages = list(job.pages.select_related("document").order_by("document__position", "number"))
    stored = {d.pk: hashlib.sha256((cluster.bucket / d.source).read_bytes()).hexdigest() for d in job.documents.all()}
    sent = {
        p.pk: f"page {hashlib.sha1(f'{stored[p.document_id]}:{p.number}'.encode()).hexdigest()[:12]}" for p in pages
    }
    assert {p.pk: p.read_result()["text"] for p in pages} == sent

    response = httpx.get(f"{cluster.b.url}/v1/jobs/{job.pk}/result.jsonl", headers=cluster.headers, timeout=30)
    assert response.status_code == 200, response.text
    records = [json.loads(line) for line in response.text.splitlines()]
    assert [(r["document"], r["page"], r["text"]) for r in records] == [
        (p.document.name, p.number, sent[p.pk]) for p in pages
    ]
    text = httpx.get(f"{cluster.b.url}/v1/jobs/{job.pk}/result.txt", headers=cluster.headers, timeout=30).text
    assert all(line in text for line in sent.values())


def test_host_a_killed_with_9_mid_job_loses_no_page_and_does_none_twice(cluster):
    cluster.a.start_front()
    cluster.a.start_workers()  # host A alone at first: its dispatcher takes the job
    pool = sim_pool()
    job = cluster.submit(cluster.a, {"scan.tif": frames(60)}, pool)

    def a_dispatcher_stopped_holding_pages() -> Dispatcher | None:
        """Mid-job, host A's dispatch loop frozen (SIGSTOP): the pages it holds now are those it dies holding."""
        done = job.pages.filter(status=Page.Status.DONE).count()
        dispatcher = done >= 5 and Dispatcher.objects.live().filter(pool=pool, host="host-a").first()
        if not dispatcher:
            return None
        os.kill(dispatcher.pid, signal.SIGSTOP)
        if job.pages.filter(status=Page.Status.RUNNING, claim_token=dispatcher.token).exists():
            return dispatcher
        os.kill(dispatcher.pid, signal.SIGCONT)
        return None

    dispatcher = wait_for(a_dispatcher_stopped_holding_pages, GUARD, lambda: f"no page was done\n{cluster.logs()}")
    cluster.b.start_front()
    cluster.b.start_workers()
    wait_for(lambda: cluster.b.workers.alive() and _reported("host-b"), 60, lambda: f"B never up\n{cluster.logs()}")

    kill_tree(psutil.Process(cluster.a.workers.pid))  # host A goes: its workers and its front, with -9
    kill_tree(psutil.Process(cluster.a.front.pid))
    held = job.pages.filter(status=Page.Status.RUNNING, claim_token=dispatcher.token).count()
    assert held > 0 and job.pages.filter(status=Page.Status.DONE).count() < 60

    # A's loop goes stale; its claims expire and its pages wait again.
    wait_for(lambda: not Dispatcher.objects.live().filter(pool=pool, host="host-a").exists(), 30, "A still live")
    # STAND-IN: the scaler's one-minute schedule (run by host B) would start a successor; run that tick once now.
    scaler_tick(pool.pk)

    cluster.wait_until_finished(job)
    assert_every_page_done_once(job)
    assert Dispatcher.objects.filter(pool=pool, host="host-b").exists()
    # B's downloads hold every page once.
    response = httpx.get(f"{cluster.b.url}/v1/jobs/{job.pk}/result.jsonl", headers=cluster.headers, timeout=30)
    records = [json.loads(line) for line in response.text.splitlines()]
    assert sorted(r["page"] for r in records) == list(range(1, 61))


def _reported(host: str) -> bool:
    from fleetadmin.models import WorkerHost

    return WorkerHost.objects.filter(host=host).exists()
