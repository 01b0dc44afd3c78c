"""The workers as production runs them (``manage.py workers``: a django-q2 cluster per work class
under one supervisor), on real daphne and tesseract pods.

- Each class is started, sized as configured, and its size logged; a dispatch loop runs in the
  dispatch cluster, a pass in the passes cluster, splits in the short tasks' cluster; the clock
  asks for a pass while something is due.
- kill -9 of an idle worker. An idle django-q2 worker waits for its next task inside
  ``multiprocessing.Queue.get`` holding the task queue's read lock (the other idle workers wait for
  that lock). Killed there, it never frees the lock: django-q2's replacement worker logs "ready"
  and no task runs again. The supervisor starts that worker's cluster afresh instead, alone (the
  other classes' clusters run on: their queues and locks are their own), so a job submitted
  afterwards is done, every page once, with nobody stepping in.
- kill -9 of the supervisor takes every cluster with it.
- However the supervisor ends (Ctrl-C, SIGTERM, kill -9, or Ctrl-C then kill -9 before its grace is
  over), every process of every cluster ends within the grace, even with a task hung on a remote:
  django-q2 alone waits for that task for ever.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import sys
from pathlib import Path

import httpx
import pytest
from django.conf import settings
from django.utils import timezone
from django_q.models import Task
from django_q.tasks import async_task

from accounts.models import ApiToken
from fleetadmin.clusters import CLASSES, DISPATCH, OUTPUTS, PASSES, SHORT, brokers, cluster_name
from fleetadmin.workers import ProcInfo, proc_info, processes
from ocrjobs.models import Dispatcher, Job
from pods.enqueue import enqueue_fetch_catalogue
from pods.models import Pool
from pods.services import passes
from tests.assertions import assert_every_page_done_once
from tests.e2e.conftest import queues_of_its_own
from tests.factories import pdf_bytes
from tools.processes import Process, child_env, start_workers, wait_for

pytestmark = pytest.mark.e2e

GUARD = 180  # seconds, against hangs only
READY = re.compile(rb"ready for work at (\d+)")


def living_workers(workers: Process, cluster: int | None = None) -> list[int]:
    """The django-q2 workers now alive under the supervisor (each logs "ready for work at <pid>"),
    or those of one cluster (its main process's pid: the cluster's process group)."""
    session = workers.popen.pid  # tools.processes.Process starts a session of its own
    alive = {p.pid for p in processes() if p.session == session and p.state not in "ZX"
             and (cluster is None or p.pgrp == cluster)}  # fmt: skip
    return [pid for pid in map(int, READY.findall(workers.log_path.read_bytes())) if pid in alive]


def clusters(workers: Process) -> dict[str, ProcInfo]:
    """Each work class's cluster: the main process the supervisor started (``workers --cluster <class>``)."""
    found = {}
    for process in processes():
        if process.ppid == workers.popen.pid and process.state not in "ZX":
            argv = Path(f"/proc/{process.pid}/cmdline").read_bytes().split(b"\0")
            if b"--cluster" in argv:
                found[argv[argv.index(b"--cluster") + 1].decode()] = process
    return found


def all_clusters_ready(workers: Process, sizes: dict[str, int]) -> dict[str, ProcInfo] | None:
    running = clusters(workers)
    if set(running) != set(CLASSES):
        return None
    ready = {name: len(living_workers(workers, cluster.pid)) for name, cluster in running.items()}
    return running if ready == sizes else None


def still_running(process: ProcInfo) -> bool:
    now = proc_info(process.pid)
    return now is not None and now.start_ticks == process.start_ticks and now.state not in "ZX"


def ran_in(func: str) -> set[str]:
    """The clusters that ran a task of this function (django-q2's Task rows name the cluster)."""
    return set(Task.objects.filter(func=func).values_list("cluster", flat=True))


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


@pytest.mark.once_sqlite  # processes (django-q2's own task queue), not the database or the broker
@pytest.mark.timeout(900)
def test_an_idle_worker_killed_with_9_restarts_its_own_cluster_and_the_others_run_on(live_system, admin_user):
    headers = {"Authorization": f"Bearer {ApiToken.issue(user=admin_user, name='e2e', scopes=['submit'])[1]}"}
    assert_every_page_done_once(submit_and_finish(live_system, headers, "before.pdf"))
    # Idle: the dispatch loop has ended by itself (it lingers a moment after its backlog is done).
    wait_for(lambda: not Dispatcher.objects.filter(ended_at=None).exists(), GUARD,
             lambda: f"the dispatcher never ended\n{live_system.logs()}")  # fmt: skip
    passes.pass_request()  # whatever the pass finds to do
    # Each kind of task ran in its class's cluster (its Task row is saved once it ended). Splits
    # and nudged ticks keep no success row: a price fetch stands for the short tasks.
    enqueue_fetch_catalogue("local")
    for func in ("ocrjobs.tasks.dispatch_pool", "pods.tasks.advance_pods", "pods.tasks.fetch_catalogue"):
        wait_for(lambda func=func: ran_in(func), GUARD, lambda: f"no task ended\n{live_system.logs()}")
    assert ran_in("pods.tasks.fetch_catalogue") == {cluster_name(SHORT)}
    assert ran_in("ocrjobs.tasks.dispatch_pool") == {cluster_name(DISPATCH)}
    assert ran_in("pods.tasks.advance_pods") == {cluster_name(PASSES)}
    before = clusters(live_system.workers)
    short = before[SHORT]

    def idle_worker_holding_the_queue() -> int | None:
        workers = living_workers(live_system.workers, short.pid)
        return next((pid for pid in workers if reading_the_task_queue(pid)), None)

    victim = wait_for(idle_worker_holding_the_queue, GUARD, lambda: f"no idle worker\n{live_system.logs()}")
    workers = len(living_workers(live_system.workers, short.pid))

    os.kill(victim, signal.SIGKILL)

    def short_tasks_cluster_replaced() -> ProcInfo | None:
        now = clusters(live_system.workers).get(SHORT)
        if now is None or now.pid == short.pid or len(living_workers(live_system.workers, now.pid)) < workers:
            return None
        return now

    # django-q2 alone would reincarnate the worker, and no task would run; the supervisor starts the
    # short tasks' cluster afresh.
    wait_for(short_tasks_cluster_replaced, GUARD, lambda: f"the cluster was not replaced\n{live_system.logs()}")
    assert still_running(before[PASSES]) and still_running(before[DISPATCH])  # never ended, never restarted
    assert_every_page_done_once(submit_and_finish(live_system, headers, "after.pdf"))
    assert ran_in("ocrjobs.tasks.dispatch_pool") == {cluster_name(DISPATCH)}


@pytest.mark.timeout(300)
def test_the_clock_asks_for_a_pass_while_something_is_due(transactional_db, local_pool, tmp_path, monkeypatch):
    # Queues of its own, emptied: a pass an earlier test left queued on a shared Redis would run
    # here at once, before anything is due.
    cluster = queues_of_its_own(monkeypatch, "clock")
    workers = start_workers(child_env(tmp_path, Q_WORKERS="1", Q_CLUSTER_NAME=cluster), tmp_path, name="workers")
    try:
        wait_for(lambda: all_clusters_ready(workers, {SHORT: 1, PASSES: 1, DISPATCH: 1, OUTPUTS: 1}), GUARD,
                 lambda: f"the workers never got ready\n{workers.tail()}")  # fmt: skip
        assert not Task.objects.filter(func="pods.tasks.advance_pods").exists()
        # Due now, and nobody asks for a pass (no scaler tick runs here): the clock does.
        Pool.objects.filter(pk=local_pool.pk).update(shed_tick_at=timezone.now())

        def a_pass_ran() -> bool:
            return Task.objects.filter(func="pods.tasks.advance_pods", success=True).exists()

        wait_for(a_pass_ran, GUARD, lambda: f"no pass ran\n{workers.tail(80)}")
        assert ran_in("pods.tasks.advance_pods") == {cluster_name(PASSES)}
    finally:
        workers.stop()


@pytest.mark.once_sqlite  # processes, not the database
@pytest.mark.timeout(300)
def test_each_class_runs_sized_as_configured_and_the_workers_killed_with_9_take_every_cluster_with_them(
    transactional_db, local_pool, tmp_path
):
    Pool.objects.create(key="second", max_pods=1)
    env = child_env(tmp_path, Q_WORKERS="2", Q_PASS_WORKERS="2", DISPATCHERS_PER_POOL="2", Q_OUTPUT_WORKERS="3")
    workers = start_workers(env, tmp_path, name="workers")
    try:
        sizes = {SHORT: 2, PASSES: 2, DISPATCH: 4, OUTPUTS: 3}  # 2 dispatch loops per pool × 2 pools
        running = wait_for(lambda: all_clusters_ready(workers, sizes), GUARD,
                           lambda: f"the clusters never got ready as sized\n{workers.tail()}")  # fmt: skip
        log = workers.log_path.read_text()
        limits = {SHORT: settings.Q_TIMEOUT, PASSES: settings.Q_PASS_TIMEOUT, DISPATCH: settings.Q_DISPATCH_TIMEOUT}
        assert (
            f"short tasks: 2 workers (Q_WORKERS; time limit {limits[SHORT]} s) (cluster {cluster_name(SHORT)})" in log
        )
        assert (
            f"passes: 2 workers (Q_PASS_WORKERS; time limit {limits[PASSES]} s) (cluster {cluster_name(PASSES)})" in log
        )
        assert (f"dispatch loops: 4 workers (DISPATCHERS_PER_POOL 2 × 2 pools; time limit {limits[DISPATCH]} s) "
                f"(cluster {cluster_name(DISPATCH)})") in log  # fmt: skip
        assert (f"outputs: 3 workers (Q_OUTPUT_WORKERS; time limit {settings.Q_OUTPUT_TIMEOUT} s) "
                f"(cluster {cluster_name(OUTPUTS)})") in log  # fmt: skip
        supervisor = workers.popen.pid

        def cluster_members() -> list[ProcInfo]:
            return [p for p in processes() if p.session == supervisor and p.pid != supervisor]

        # Each cluster: its main process, Sentinel, monitor, pusher and workers. (django-q2's Sentinel
        # forks the monitor and the pusher after its workers, which may be ready before them.)
        expected = sum(4 + size for size in sizes.values())
        members = wait_for(lambda: found if len(found := cluster_members()) >= expected else None, GUARD,
                           lambda: f"{len(cluster_members())} processes, not {expected}\n{workers.tail()}")  # fmt: skip
        assert len(members) == expected
        assert {p.pgrp for p in members} == {cluster.pid for cluster in running.values()}

        workers.popen.kill()
        workers.popen.wait()

        def left() -> list[ProcInfo]:
            return [p for p in members if still_running(p)]

        # Unsupervised, the clusters would run on, and the next supervisor would start more beside them.
        wait_for(lambda: not left(), GUARD, lambda: f"left running: {left()}\n{workers.tail()}")
    finally:
        workers.stop()


def wait_for_an_answer(port: int) -> None:
    """A task hung on a remote: it waits, without a limit, for a peer that never answers."""
    with socket.create_connection(("127.0.0.1", port)) as connection:
        connection.recv(1)


@pytest.mark.once_sqlite  # processes, not the database
@pytest.mark.parametrize("end", ["ctrl-c", "sigterm", "kill-9", "ctrl-c-then-kill-9"])
@pytest.mark.timeout(300)
def test_every_cluster_process_ends_within_the_grace_however_the_supervisor_ends_with_a_task_hung(
    transactional_db, tmp_path, end
):
    for broker in brokers().values():
        broker.purge_queue()  # nothing left over from earlier tests
    silent = socket.create_server(("127.0.0.1", 0))  # takes connections and never answers
    silent.settimeout(GUARD)
    grace = 2
    argv = [sys.executable, "manage.py", "workers", f"--grace={grace}"]
    workers = Process("workers", argv, child_env(tmp_path, Q_WORKERS="1"), tmp_path)  # leads its own session
    try:
        # Each class's cluster, guarded: its Sentinel logs it once it has forked the cluster's processes.
        wait_for(lambda: workers.log_path.read_text().count("GuardedSentinel guards the cluster") == len(CLASSES),
                 GUARD, lambda: f"the clusters never got ready, each guarded\n{workers.tail()}")  # fmt: skip
        async_task(f"{__name__}.wait_for_an_answer", silent.getsockname()[1], cluster=cluster_name(SHORT))
        hung, _ = silent.accept()  # a short-task worker now waits on it
        supervisor = workers.popen.pid
        members = [p for p in processes() if p.session == supervisor and p.pid != supervisor]
        # Each cluster: its main process, Sentinel, monitor, pusher and workers, in a group of its own.
        assert len({p.pgrp for p in members}) == len(CLASSES) and len(members) >= len(CLASSES) * 5

        if end in ("ctrl-c", "ctrl-c-then-kill-9"):
            os.killpg(supervisor, signal.SIGINT)  # what a terminal sends its foreground group
        elif end == "sigterm":
            os.kill(supervisor, signal.SIGTERM)
        if end in ("kill-9", "ctrl-c-then-kill-9"):
            if end == "ctrl-c-then-kill-9":
                wait_for(lambda: "stopping the workers" in workers.log_path.read_text(), GUARD, workers.tail)
            os.kill(supervisor, signal.SIGKILL)

        def left() -> list[ProcInfo]:
            return [p for p in members if still_running(p)]

        # A guard against hangs: without the watchdog they live on, orphaned, until their task ends.
        wait_for(lambda: not left(), grace + 60, lambda: f"left running: {left()}\n{workers.tail(80)}")
        workers.popen.wait(GUARD)
        hung.close()
    finally:
        silent.close()
        workers.stop()
