"""kill -9 of an idle worker, on real daphne, workers (``manage.py workers``) and tesseract pods.

An idle django-q2 worker waits for its next task inside ``multiprocessing.Queue.get`` holding the
task queue's read lock (the other idle workers wait for that lock). Killed there, it never frees
the lock: django-q2's replacement worker logs "ready" and no task runs again. The workers'
supervisor starts the cluster afresh instead, so a job submitted afterwards is done, every page
once, with nobody stepping in.
"""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

import httpx
import pytest

from accounts.models import ApiToken
from fleetadmin.workers import ProcInfo, proc_info, processes
from ocrjobs.models import Dispatcher, Job
from tests.assertions import assert_every_page_done_once
from tests.factories import pdf_bytes
from tools.processes import child_env, start_workers, wait_for

pytestmark = pytest.mark.e2e

GUARD = 180  # seconds, against hangs only
READY = re.compile(rb"ready for work at (\d+)")


def living_workers(system) -> list[int]:
    """The django-q2 workers now alive under the supervisor (each logs "ready for work at <pid>")."""
    session = system.workers.popen.pid  # tools.processes.Process starts a session of its own
    alive = {p.pid for p in processes() if p.session == session and p.state not in "ZX"}
    return [pid for pid in map(int, READY.findall(system.workers.log_path.read_bytes())) if pid in alive]


def reading_the_task_queue(pid: int) -> bool:
    """Whether the process is blocked reading a pipe: for an idle worker, the task queue's, holding its
    read lock. The other idle workers wait for the lock in a futex call, whose first argument is an
    address, not a file descriptor."""
    try:
        call = Path(f"/proc/{pid}/syscall").read_text().split()  # "<number> <first argument> ..."
        return len(call) > 1 and os.readlink(f"/proc/{pid}/fd/{int(call[1], 16)}").startswith("pipe:")
    except (OSError, ValueError):
        return False


def submit_and_finish(system, headers: dict[str, str], name: str) -> Job:
    response = httpx.post(f"{system.url}/v1/jobs", headers=headers, data={"pool": "local"},
                          files={"files": (name, pdf_bytes(), "application/pdf")}, timeout=30)  # fmt: skip
    assert response.status_code == 201, response.text
    job = Job.objects.get(pk=response.json()["id"])

    def finished() -> bool:
        job.refresh_from_db()
        return job.is_finished

    wait_for(finished, GUARD, lambda: f"job {job.pk} ({name}) did not finish\n{system.logs()}")
    return job


@pytest.mark.timeout(900)
def test_an_idle_worker_killed_with_9_does_not_stop_the_workers_for_good(live_system, admin_user):
    headers = {"Authorization": f"Bearer {ApiToken.issue(user=admin_user, name='e2e', scopes=['submit'])[1]}"}
    assert_every_page_done_once(submit_and_finish(live_system, headers, "before.pdf"))
    # Idle: the dispatch loop has ended by itself (it lingers a moment after its backlog is done).
    wait_for(lambda: not Dispatcher.objects.filter(ended_at=None).exists(), GUARD,
             lambda: f"the dispatcher never ended\n{live_system.logs()}")  # fmt: skip

    def idle_worker_holding_the_queue() -> int | None:
        return next((pid for pid in living_workers(live_system) if reading_the_task_queue(pid)), None)

    victim = wait_for(idle_worker_holding_the_queue, GUARD, lambda: f"no idle worker\n{live_system.logs()}")
    workers = len(living_workers(live_system))

    os.kill(victim, signal.SIGKILL)

    def as_many_workers_as_before() -> bool:
        living = living_workers(live_system)
        return victim not in living and len(living) >= workers

    # django-q2 alone gets here too (it reincarnates the worker); only with the supervisor do tasks run.
    wait_for(as_many_workers_as_before, GUARD, lambda: f"the workers were not replaced\n{live_system.logs()}")
    assert_every_page_done_once(submit_and_finish(live_system, headers, "after.pdf"))


@pytest.mark.timeout(300)
def test_the_workers_killed_with_9_take_their_cluster_with_them(transactional_db, tmp_path):
    workers = start_workers(child_env(tmp_path, Q_WORKERS="2"), tmp_path, name="workers")
    try:
        wait_for(lambda: len(READY.findall(workers.log_path.read_bytes())) >= 2, GUARD,
                 lambda: f"the workers never got ready\n{workers.tail()}")  # fmt: skip
        supervisor = workers.popen.pid
        cluster = [p for p in processes() if p.session == supervisor and p.pid != supervisor]
        assert len(cluster) >= 4  # the cluster's main process, its Sentinel, monitor, pusher and workers

        workers.popen.kill()
        workers.popen.wait()

        def left() -> list[ProcInfo]:
            return [p for p in cluster if (now := proc_info(p.pid)) and now.start_ticks == p.start_ticks
                    and now.state not in "ZX"]  # fmt: skip

        # Unsupervised, a cluster would run on, and the next supervisor would start a second one.
        wait_for(lambda: not left(), GUARD, lambda: f"left running: {left()}\n{workers.tail()}")
    finally:
        workers.stop()
