"""The workers' supervisor (fleetadmin.workers): when a cluster is started afresh, that a restart
or a stop leaves no process of the old cluster behind, that a broken cluster is started afresh
alone while the others run on, and that it calls the clock.

The supervisor tests run it on small stand-in clusters (plain Python processes) instead of
django-q2; tests/e2e/test_worker_supervisor.py runs the real ones, one per work class.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from fleetadmin.workers import (
    DeadWatch,
    ProcInfo,
    Supervised,
    Supervisor,
    group_members,
    guarded_sentinel_class,
    killed_by_signal,
    proc_info,
    process_tree,
    restart_delay,
)
from tools.processes import REPO as ROOT
from tools.processes import wait_for

GUARD = 60  # seconds, against hangs only


# --- the decisions ----------------------------------------------------------------------------------


def test_only_a_process_killed_by_a_signal_counts_as_killed():
    assert killed_by_signal(-9) and killed_by_signal(-15)
    assert not killed_by_signal(None)  # still running: a worker the Sentinel is about to stop for a timeout
    assert not killed_by_signal(0)  # recycled, or ended its task after a timeout
    assert not killed_by_signal(1)  # a Python error: its locks were released on the way out


class EndedCluster(Exception):
    pass


@pytest.fixture
def sentinel(monkeypatch):
    """A GuardedSentinel that starts nothing: what it reincarnates and whether it ends its cluster."""
    from django_q.cluster import Sentinel

    def end_cluster():
        raise EndedCluster()

    reincarnated = []
    monkeypatch.setattr(Sentinel, "reincarnate", lambda self, process: reincarnated.append(process))
    cls = guarded_sentinel_class()
    guarded = cls.__new__(cls)
    monkeypatch.setattr(guarded, "end_cluster", end_cluster)
    guarded.reincarnated = reincarnated
    return guarded


@pytest.mark.parametrize("exitcode", [-9, -15, -11, -40])
def test_the_sentinel_ends_its_cluster_when_a_process_of_it_was_killed(sentinel, exitcode):
    killed = SimpleNamespace(name="Process-1", pid=4242, exitcode=exitcode)
    with pytest.raises(EndedCluster):
        sentinel.reincarnate(killed)
    assert sentinel.reincarnated == []


@pytest.mark.parametrize("exitcode", [0, 1, None])
def test_the_sentinel_reincarnates_a_recycled_timed_out_or_failed_worker_as_django_q2_does(sentinel, exitcode):
    worker = SimpleNamespace(name="Process-1", pid=4242, exitcode=exitcode)
    sentinel.reincarnate(worker)
    assert sentinel.reincarnated == [worker]


def test_restarts_of_a_cluster_that_keeps_dying_young_wait_longer_up_to_a_minute():
    delays = [restart_delay(n) for n in range(10)]
    assert delays == sorted(delays)
    assert delays[0] <= 2 and delays[-1] == 60


def _proc(pid: int, state: str = "S", start: int = 100) -> ProcInfo:
    return ProcInfo(pid=pid, state=state, ppid=1, pgrp=10, session=10, start_ticks=start)


def test_a_process_dead_and_unreaped_past_the_limit_means_the_cluster_is_stuck():
    watch = DeadWatch(stuck_seconds=60)
    main, sentinel, worker = _proc(10), _proc(11), _proc(12)
    assert watch.stuck([main, sentinel, worker], 10, now=0) is None
    dead = _proc(12, "Z")
    assert watch.stuck([main, sentinel, dead], 10, now=1) is None
    assert watch.stuck([main, sentinel, dead], 10, now=60) is None
    assert watch.stuck([main, sentinel, dead], 10, now=61) == dead


def test_a_dead_process_that_was_reaped_in_time_or_is_the_main_one_is_not_stuck():
    watch = DeadWatch(stuck_seconds=60)
    main, sentinel = _proc(10), _proc(11)
    assert watch.stuck([main, sentinel, _proc(12, "Z")], 10, now=0) is None
    assert watch.stuck([main, sentinel], 10, now=30) is None  # reaped: forgotten
    assert watch.stuck([main, sentinel, _proc(12, "Z", start=200)], 10, now=70) is None  # the pid reused
    assert watch.stuck([_proc(10, "Z"), sentinel], 10, now=500) is None  # the main process: the supervisor reaps it


# --- the supervisor, on stand-in clusters -----------------------------------------------------------

# A stand-in cluster: it records each start (its pid, a helper process of its group, and whether a
# process of an earlier start's group was still alive), then behaves as its run number says.
STAND_IN = textwrap.dedent(
    """
    import json, os, signal, subprocess, sys, time
    from pathlib import Path

    sys.path.insert(0, {repo!r})
    from fleetadmin.workers import group_members

    record = Path({record!r})
    runs = [json.loads(line) for line in record.read_text().splitlines()] if record.exists() else []
    behaviour = {behaviours!r}[min(len(runs), {last})]
    if behaviour == "ignore-sigterm":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if behaviour == "hang-on-stop":  # as django-q2 does with a worker hung on a remote, under the watchdog
        from fleetadmin.workers import ClusterWatchdog

        signal.signal(signal.SIGTERM, lambda signum, frame: time.sleep(600))
        ClusterWatchdog(os.getppid(), grace_seconds=1, poll_seconds=0.1).start()
    helper = subprocess.Popen([sys.executable, "-c", "import signal, time; "
                               "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"])
    leftovers = [p.pid for run in runs for p in group_members(run["pid"])]
    if behaviour == "leave-a-zombie":
        if os.fork() == 0:  # a "Sentinel" whose "worker" dies and is never reaped
            if os.fork() == 0:
                os._exit(0)
            time.sleep(600)
            os._exit(0)
    with record.open("a") as out:
        out.write(json.dumps({{"pid": os.getpid(), "helper": helper.pid, "leftovers": leftovers}}) + "\\n")
    if behaviour == "exit-75":
        sys.exit(75)
    time.sleep(600)
    """
)


REPO = str(ROOT)


def stand_in_cluster(tmp_path: Path, record: Path, behaviours: tuple[str, ...]) -> Path:
    script = tmp_path / "stand_in_cluster.py"
    script.write_text(STAND_IN.format(repo=REPO, record=str(record), behaviours=behaviours, last=len(behaviours) - 1))
    return script


def read_runs(record: Path) -> list[dict]:
    return [json.loads(line) for line in record.read_text().splitlines()] if record.exists() else []


@pytest.fixture
def supervise(tmp_path):
    record = tmp_path / "runs.jsonl"
    started: list[tuple[Supervisor, threading.Thread]] = []

    def start(*behaviours: str, **options) -> Supervisor:
        script = stand_in_cluster(tmp_path, record, behaviours)
        supervisor = Supervisor([sys.executable, str(script)], poll_seconds=0.1, **options)
        thread = threading.Thread(target=supervisor.run, daemon=True)
        thread.start()
        started.append((supervisor, thread))
        return supervisor

    start.runs = lambda: read_runs(record)
    yield start
    for supervisor, thread in started:
        supervisor.stop()
        thread.join(GUARD)


def _alive(pid: int) -> bool:
    info = proc_info(pid)
    return info is not None and info.state not in "ZX"


def test_a_cluster_that_exits_is_started_afresh_once_every_process_of_its_group_is_killed(supervise):
    supervisor = supervise("exit-75", "stay")

    first, second = wait_for(lambda: supervise.runs()[:2] if len(supervise.runs()) >= 2 else None, GUARD,
                             lambda: f"the cluster was not started again: {supervise.runs()}")  # fmt: skip
    assert first["leftovers"] == []
    assert second["leftovers"] == []  # the first cluster's helper, which ignores SIGTERM, was gone before
    assert not _alive(first["helper"])
    assert _alive(second["pid"]) and _alive(second["helper"])
    assert supervisor.restarts == 1


def test_a_cluster_with_a_process_dead_and_unreaped_is_started_afresh(supervise):
    supervise("leave-a-zombie", "stay", stuck_seconds=1)

    first, second = wait_for(lambda: supervise.runs()[:2] if len(supervise.runs()) >= 2 else None, GUARD,
                             lambda: f"the stuck cluster was not started again: {supervise.runs()}")  # fmt: skip
    assert second["leftovers"] == []
    assert group_members(first["pid"]) == []


@pytest.mark.parametrize("behaviour", ["stay", "ignore-sigterm"])
def test_stop_ends_every_process_of_the_cluster_and_starts_none_again(supervise, behaviour):
    supervisor = supervise(behaviour, grace_seconds=1)
    run = wait_for(lambda: supervise.runs()[0] if supervise.runs() else None, GUARD, "the cluster never started")

    supervisor.stop()

    wait_for(lambda: supervisor.clusters[0].popen.poll() is not None and not group_members(run["pid"]), GUARD,
             lambda: f"left running: {group_members(run['pid'])}")  # fmt: skip
    assert not _alive(run["helper"])
    assert len(supervise.runs()) == 1 and supervisor.restarts == 0


def test_a_broken_cluster_is_started_afresh_alone_while_the_others_run_on(tmp_path):
    records = {name: tmp_path / f"{name}.jsonl" for name in ("short", "passes", "dispatch")}
    behaviours = {"short": ("stay",), "passes": ("exit-75", "stay"), "dispatch": ("stay",)}
    clusters = []
    for name, record in records.items():
        folder = tmp_path / name
        folder.mkdir()
        script = stand_in_cluster(folder, record, behaviours[name])
        clusters.append(Supervised(name, [sys.executable, str(script)]))
    supervisor = Supervisor(clusters, poll_seconds=0.1, grace_seconds=1)
    thread = threading.Thread(target=supervisor.run, daemon=True)
    thread.start()
    try:
        wait_for(lambda: len(read_runs(records["passes"])) >= 2, GUARD, "the broken cluster was not started again")
        [short], [dispatch] = read_runs(records["short"]), read_runs(records["dispatch"])
        assert _alive(short["pid"]) and _alive(dispatch["pid"])  # never ended, never started again
        assert [c.restarts for c in supervisor.clusters] == [0, 1, 0]
    finally:
        supervisor.stop()
        thread.join(GUARD)
    assert not any(_alive(run["pid"]) for record in records.values() for run in read_runs(record))


def test_the_supervisor_calls_its_clock_while_it_runs_and_not_after_it_stopped(tmp_path):
    script = stand_in_cluster(tmp_path, tmp_path / "runs.jsonl", ("stay",))
    calls = []
    supervisor = Supervisor([sys.executable, str(script)], poll_seconds=0.1, grace_seconds=1,
                            clock=lambda: calls.append(1), clock_seconds=0.05)  # fmt: skip
    thread = threading.Thread(target=supervisor.run, daemon=True)
    thread.start()
    try:
        wait_for(lambda: len(calls) >= 5, GUARD, "the clock was not called again and again")
    finally:
        supervisor.stop()
        thread.join(GUARD)
    called = len(calls)
    threading.Event().wait(0.3)
    assert len(calls) == called


@contextlib.contextmanager
def supervisor_killed_with_9(tmp_path: Path, behaviour: str):
    """A supervisor process running a stand-in cluster, killed with -9 once the cluster started; the
    cluster's run. What is left of the cluster's group is killed at the end, whatever happens."""
    record = tmp_path / "runs.jsonl"
    script = stand_in_cluster(tmp_path, record, (behaviour,))
    supervisor = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {REPO!r})
        from fleetadmin.workers import Supervisor
        Supervisor([sys.executable, {str(script)!r}], poll_seconds=0.1).run()
        """)])  # fmt: skip
    run = wait_for(lambda: read_runs(record)[0] if read_runs(record) else None, GUARD, "the cluster never started")
    try:
        supervisor.kill()
        supervisor.wait()
        yield run
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(run["pid"], signal.SIGKILL)  # the stand-in's helper ignores SIGTERM


def test_a_supervisor_killed_with_9_takes_its_cluster_with_it(tmp_path):
    with supervisor_killed_with_9(tmp_path, "stay") as run:
        # the cluster got SIGTERM (a real one stops its workers, which finish their tasks first)
        wait_for(lambda: not _alive(run["pid"]), GUARD, "the cluster outlived its supervisor")


def test_a_cluster_hung_on_its_stop_ends_whole_within_its_grace_once_its_supervisor_is_killed_with_9(tmp_path):
    with supervisor_killed_with_9(tmp_path, "hang-on-stop") as run:
        # Its SIGTERM handler never returns and its helper ignores SIGTERM: the watchdog kills the group.
        wait_for(lambda: not group_members(run["pid"]), GUARD, lambda: f"left: {group_members(run['pid'])}")


def test_django_q2_still_forks_the_sentinel_class_it_finds_in_its_module():
    # run_cluster replaces django_q.cluster.Sentinel (no public hook): that takes effect only while
    # Cluster.start() looks the name up in its module's globals when it runs, and while the Sentinel
    # has what GuardedSentinel overrides and reads.
    from django_q.cluster import Cluster, Sentinel

    assert "Sentinel" in Cluster.start.__code__.co_names
    assert {"reincarnate", "guard"} <= set(vars(Sentinel))
    assert {"pusher", "pool", "monitor"} <= set(Sentinel.__init__.__code__.co_names)


def test_a_process_gone_between_its_stat_and_its_children_is_not_an_error(monkeypatch):
    # It exits after proc_info read it, and after glob saw its task directory but before glob
    # listed it: scandir raises FileNotFoundError. That once ended the supervisor (CI,
    # test_worker_supervisor). The race made certain: its task directory vanishes mid-glob.
    info = ProcInfo(os.getpid(), "S", os.getppid(), os.getpgrp(), os.getsid(0), 1)
    monkeypatch.setattr("fleetadmin.workers.proc_info", lambda pid: info if pid == info.pid else None)

    class VanishingTasks(type(Path())):
        def glob(self, pattern):
            if self.name == "task":
                raise FileNotFoundError(2, "No such file or directory", str(self))
            return super().glob(pattern)

    monkeypatch.setattr("fleetadmin.workers.Path", VanishingTasks)

    assert process_tree(info.pid) == [info]


def test_an_unexpected_error_while_supervising_is_logged_and_the_supervisor_goes_on(supervise, monkeypatch, caplog):
    # Any error out of a cycle used to end the supervisor, and with it (PDEATHSIG) every cluster.
    from fleetadmin import workers

    failures = []
    real_tree = workers.process_tree

    def failing_twice(pid: int) -> list[ProcInfo]:
        if len(failures) < 2:
            failures.append(pid)
            raise RuntimeError("something nobody foresaw")
        return real_tree(pid)

    monkeypatch.setattr(workers, "process_tree", failing_twice)
    supervisor = supervise("stay", "stay")
    wait_for(lambda: len(failures) == 2 and supervise.runs(), GUARD, "the cluster was never watched")
    [first] = supervise.runs()

    # After the errors the supervisor is still there: the cluster, killed, is started afresh.
    os.kill(first["pid"], signal.SIGKILL)
    wait_for(lambda: len(supervise.runs()) >= 2, GUARD, lambda: f"not started again: {supervise.runs()}")
    assert supervisor.restarts == 1
    logged = [r for r in caplog.records if "supervising the cluster workers failed" in r.getMessage()]
    assert len(logged) == 1 and "something nobody foresaw" in logged[0].exc_text


ENDED_WITH_PARENT = """
import os, subprocess, sys, time
from fleetadmin.workers import ended_with
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], preexec_fn=ended_with(os.getpid()))
print(child.pid, flush=True)
time.sleep(600)
"""


def test_a_child_started_with_ended_with_ends_when_its_parent_is_killed():
    # The ctypes prctl(PR_SET_PDEATHSIG) that `up` and the supervisor start their children with.
    import subprocess
    import sys
    import time

    parent = subprocess.Popen([sys.executable, "-c", ENDED_WITH_PARENT], stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    assert os.path.exists(f"/proc/{child}")

    parent.kill()
    parent.wait(30)
    deadline = time.monotonic() + 30
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)

    assert not _alive(child)


def _alive(pid: int) -> bool:
    """Running, not a zombie waiting for init to reap it."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
