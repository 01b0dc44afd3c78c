"""The workers: a django-q2 cluster per work class (fleetadmin/clusters.py), under a supervisor
that starts each afresh when it breaks.

django-q2's processes share multiprocessing queues whose locks are plain semaphores. An idle
worker waits for its next task inside ``Queue.get`` holding the task queue's read lock; killed
there by a signal (``kill -9``, the OOM killer), it never gives the lock back. The Sentinel
reincarnates it, the new worker logs "ready" and waits on the lock with the others, and no task
runs again. The monitor holds the result queue's read lock the same way, and a feeder thread
holds a queue's write lock while it writes. A lock whose holder is dead cannot be freed from
inside the cluster, so the cluster is ended as a whole and started again:

- ``GuardedSentinel`` ends its cluster, instead of reincarnating, when it finds one of its
  processes killed by a signal. It never signals a process it still guards (a worker it stops for
  a timeout leaves the pool first), and recycled or timed-out workers exit by themselves with 0;
- ``Supervisor`` runs each cluster in a process group of its own. When a cluster exits, or one of
  its processes stays dead and unreaped for ``stuck_seconds`` (the Sentinel's guard loop is stuck,
  e.g. on the timer lock of a worker killed while holding it), it kills that cluster's whole group
  and starts it anew; the other clusters run on (their queues' locks are their own). SIGTERM or
  Ctrl-C gives the workers ``grace_seconds`` to finish, then kills every group;
- ``ClusterWatchdog`` ends its cluster's whole group ``grace_seconds`` after the cluster was asked
  to stop, or after its supervisor went away (killed with -9: the kernel sends the cluster SIGTERM,
  and the watchdog notices the new parent besides). django-q2 stops a cluster by waiting for every
  worker to finish its task, without a limit, so a task hung on another machine would otherwise
  keep the cluster alive for ever, unsupervised, beside the one the next start brings up.

Tasks killed with a cluster are run again after the broker's ``retry`` (ORM broker); splits and
fetches, whose rows hold task leases, are sent again by the scaler tick once their leases lapse
(fleetadmin/leases.py), on either broker; a boot, release or scale request is a row that the next
pass takes up once the dead step's lease lapses (pods/services/passes.py).

Length: the cluster's side (its Sentinel, its watchdog) and the supervisor's are one mechanism,
read together: the same process groups, grace, exit codes and /proc walk.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

LOG_EVERY_SECONDS = 60.0  # an unexpected error that lasts is logged this often, not every cycle

# The cluster's exit code when its Sentinel ended it because a process was killed (EX_TEMPFAIL).
EXIT_PROCESS_KILLED = 75
# A cluster that ran this long was healthy: the next restart waits the shortest delay again.
HEALTHY_SECONDS = 60.0
# The dead watch reads a cluster's processes this often at most (a quarter of its stuck_seconds when
# that is shorter): a zombie must last stuck_seconds (60) to count, so reading more often finds
# nothing sooner.
WATCH_SECONDS = 5.0
MAX_RESTART_DELAY = 60.0


def killed_by_signal(exitcode: int | None) -> bool:
    """Whether a cluster process ended by a signal, so that a queue lock it held may never be freed.

    ``None`` is a process still running (a worker the Sentinel is about to stop for a timeout);
    0 or more is a process that exited by itself, releasing its locks on the way out.
    """
    return exitcode is not None and exitcode < 0


def restart_delay(quick_failures: int) -> float:
    """Seconds before the next start, after ``quick_failures`` clusters in a row died young."""
    return min(MAX_RESTART_DELAY, 2.0 ** max(0, quick_failures))


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def describe_exit(code: int) -> str:
    if code == EXIT_PROCESS_KILLED:
        return "its Sentinel ended it: one of its processes was killed by a signal"
    if code < 0:
        return f"its main process was killed by {signal_name(-code)}"
    return f"it exited with code {code}"


# --- the cluster (the supervisor's child) -------------------------------------------------------


def guarded_sentinel_class():
    from django_q.cluster import Sentinel
    from django_q.conf import logger

    class GuardedSentinel(Sentinel):
        def reincarnate(self, process):
            if killed_by_signal(process.exitcode):
                logger.critical(
                    "%s (pid %s) was killed by %s; a queue lock it held may never be freed, so the whole "
                    "cluster stops and is started afresh",
                    process.name,
                    process.pid,
                    signal_name(-process.exitcode),
                )
                self.end_cluster()
            super().reincarnate(process)

        def guard(self):
            # What shows the class took effect (tests/e2e/test_worker_supervisor.py looks for it).
            logger.info("%s guards the cluster: a process killed by a signal ends it", type(self).__name__)
            super().guard()

        def end_cluster(self):
            # The pusher first: no task leaves the broker for a queue that nobody will read.
            for process in [self.pusher, *self.pool, self.monitor]:
                if process is not None:
                    process.kill()
            logging.shutdown()
            os._exit(EXIT_PROCESS_KILLED)

    return GuardedSentinel


def run_cluster(*, supervisor: int | None = None, grace_seconds: float = 10.0) -> int:
    """Run one django-q2 cluster in this process until it stops; its Sentinel's exit code.

    The same as ``manage.py qcluster``, with a Sentinel that ends the cluster when one of its
    processes is killed, and a watchdog that ends the cluster's whole group ``grace_seconds`` after
    it was asked to stop or ``supervisor`` (a pid; by default this process's parent) went away
    (see the module's docstring).
    """
    import django_q.cluster

    # No public hook: django-q2 has no setting for its Sentinel class, and its defect (a worker
    # killed while it holds the task queue's lock stops the cluster for good, django-q2 issue #23)
    # has no fix upstream. Cluster.start() looks the name up in its module when it forks the
    # Sentinel; tests/fleetadmin/test_workers.py fails if it no longer does, and the end-to-end tests look for
    # the GuardedSentinel's "guards the cluster" line in each cluster's log.
    django_q.cluster.Sentinel = guarded_sentinel_class()
    cluster = django_q.cluster.Cluster()  # installs its SIGTERM and SIGINT handlers
    watchdog = ClusterWatchdog(supervisor or os.getppid(), grace_seconds)
    watchdog.start()  # before the Sentinel is forked: a stop asked meanwhile counts
    cluster.start()  # SIGTERM or SIGINT from now on: the Sentinel stops its processes and exits 0
    cluster.sentinel.join()
    code = cluster.sentinel.exitcode or 0
    return 128 - code if code < 0 else code


class ClusterWatchdog:
    """Ends every process of this cluster ``grace_seconds`` after it was asked to stop (SIGTERM or
    SIGINT) or after its supervisor went away, whatever its workers wait on.

    django-q2 stops a cluster by putting a "STOP" in the task queue for each worker and waiting,
    without a limit, for every worker to take it: a worker hung on a remote (a URL host that never
    answers) holds the cluster up for ever. The supervisor kills the cluster's group after its own
    grace, but a supervisor killed with -9 cannot: that is this thread's job. It runs in the
    cluster's main process, which is the leader of a process group of its own (the supervisor starts
    it so), so the group is every process django-q2 forked for it, wherever they were reparented.
    """

    def __init__(self, supervisor: int, grace_seconds: float, poll_seconds: float = 0.2):
        self.supervisor = supervisor
        self.grace_seconds = grace_seconds
        self.poll_seconds = poll_seconds
        self.asked_at: float | None = None  # monotonic time of the first stop signal

    def start(self) -> None:
        """Note the stop signals (then hand them to the handlers installed before) and start watching."""
        for signum in (signal.SIGTERM, signal.SIGINT):
            previous = signal.getsignal(signum)

            def noted(signum, frame, previous=previous):
                self._asked()
                if callable(previous):
                    previous(signum, frame)

            signal.signal(signum, noted)
        threading.Thread(target=self._watch, name="cluster-watchdog", daemon=True).start()

    def _asked(self) -> None:
        if self.asked_at is None:
            self.asked_at = time.monotonic()

    def _watch(self) -> None:
        while True:
            time.sleep(self.poll_seconds)
            if self.asked_at is None and os.getppid() != self.supervisor:
                log.warning("the supervisor (pid %s) is gone: the cluster stops", self.supervisor)
                self._asked()
                os.kill(os.getpid(), signal.SIGTERM)  # django-q2's stop: each worker may finish its task
            if self.asked_at is not None and time.monotonic() - self.asked_at >= self.grace_seconds:
                log.warning("the cluster did not stop within %g s; killing every process of it", self.grace_seconds)
                logging.shutdown()
                end_this_cluster()


def end_this_cluster() -> None:
    """SIGKILL to every process of the cluster this process runs, this one last."""
    if os.getpgrp() == os.getpid():  # its own group, as the supervisor starts it
        os.killpg(os.getpgrp(), signal.SIGKILL)
    for process in reversed(process_tree(os.getpid())):  # started by hand: its descendants only
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signal.SIGKILL)


# --- the supervisor --------------------------------------------------------------------------------


@dataclass(frozen=True)
class ProcInfo:
    pid: int
    state: str
    ppid: int
    pgrp: int
    session: int
    start_ticks: int  # tells a reused pid apart


def proc_info(pid: int) -> ProcInfo | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # The fields after the parenthesised command name, which may hold spaces.
    fields = stat[stat.rindex(")") + 2 :].split()
    return ProcInfo(pid, fields[0], int(fields[1]), int(fields[2]), int(fields[3]), int(fields[19]))


def processes() -> list[ProcInfo]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            info = proc_info(int(entry.name))
            if info is not None:
                found.append(info)
    return found


def group_members(pgrp: int) -> list[ProcInfo]:
    """The living processes of a process group, wherever they were reparented."""
    return [p for p in processes() if p.pgrp == pgrp and p.state not in "ZX"]


def process_tree(pid: int) -> list[ProcInfo]:
    """A process and its descendants, zombies included (cheaper than reading all of /proc)."""
    found, todo = [], [pid]
    while todo:
        info = proc_info(todo.pop())
        if info is None:
            continue
        found.append(info)
        try:
            # (A process that exits between its stat and here has no task directory left: the
            # FileNotFoundError once ended the supervisor itself, in CI.)
            listed = list(Path(f"/proc/{info.pid}/task").glob("*/children"))
        except (FileNotFoundError, ProcessLookupError):
            continue
        for children in listed:
            try:
                todo += [int(child) for child in children.read_text().split()]
            except (FileNotFoundError, ProcessLookupError):
                pass
    return found


class DeadWatch:
    """Notices a process of the cluster that stays dead and unreaped.

    django-q2 reaps its dead processes within a guard cycle (half a second) and the main process
    joins its Sentinel, so a zombie that lasts means the process that should reap it is stuck.
    """

    def __init__(self, stuck_seconds: float):
        self.stuck_seconds = stuck_seconds
        self.dead_since: dict[tuple[int, int], float] = {}

    def stuck(self, members: list[ProcInfo], main_pid: int, now: float) -> ProcInfo | None:
        zombies = {(p.pid, p.start_ticks): p for p in members if p.state == "Z" and p.pid != main_pid}
        self.dead_since = {key: self.dead_since.get(key, now) for key in zombies}
        for key, since in self.dead_since.items():
            if now - since >= self.stuck_seconds:
                return zombies[key]
        return None


PR_SET_PDEATHSIG = 1  # linux/prctl.h


def ended_with(parent: int):
    """A ``preexec_fn`` that has the kernel send SIGTERM to the child when ``parent`` dies.

    A supervisor killed with -9 would otherwise leave its cluster running unsupervised, and the next
    supervisor would start a second one beside it. SIGTERM is what ``stop()`` sends too: django-q2
    lets each worker finish its task and the cluster exits. Linux only (prctl); elsewhere, nothing.
    ctypes because the standard library has no prctl (and python-prctl, unmaintained, needs a
    compiler); tests/fleetadmin/test_workers.py::test_a_child_started_with_ended_with_ends_when_its_parent_is_killed
    fails if the call stops taking effect.
    """
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):
        return None

    def end_with_parent() -> None:  # runs in the child, between fork and exec
        prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before prctl: no signal will come
            os.kill(os.getpid(), signal.SIGTERM)

    return end_with_parent


@dataclass
class Supervised:
    """One cluster the supervisor keeps running (a work class's): how to start it, and its state."""

    name: str
    argv: list[str]
    env: dict[str, str] | None = None
    popen: subprocess.Popen | None = field(default=None, repr=False)
    started: float | None = None  # monotonic time of the latest start
    start_at: float = 0.0  # when to start it (again), while it is not running
    quick_failures: int = 0
    restarts: int = 0
    watch: DeadWatch | None = field(default=None, repr=False)
    watched_at: float = float("-inf")  # monotonic time the dead watch last read the cluster's processes


class Supervisor:
    """Runs each cluster (``argv``, or several ``Supervised``) in a process group of its own and starts
    one again, alone, whenever it breaks: the others run on.

    One thread watches them all and forks every cluster: the kernel's "parent died" signal
    (``ended_with``) follows the thread that forked, so it must be one that lives as long as the
    supervisor. ``clock``, if given, is called every ``clock_seconds`` in between (the pass clock).
    ``run()`` returns after ``stop()`` (the command calls it on SIGTERM and SIGINT), once every
    process of every cluster has ended.
    """

    def __init__(
        self,
        clusters: list[str] | list[Supervised],
        *,
        cwd: str | Path | None = None,
        env: dict[str, str] | None = None,
        grace_seconds: float = 10.0,
        stuck_seconds: float = 60.0,
        poll_seconds: float = 0.5,
        clock: Callable[[], object] | None = None,
        clock_seconds: float = 0.5,
    ):
        if clusters and isinstance(clusters[0], str):  # one cluster, given by its argv
            clusters = [Supervised("cluster", list(clusters), env)]
        self.clusters: list[Supervised] = list(clusters)
        self.cwd = cwd
        self.grace_seconds = grace_seconds
        self.stuck_seconds = stuck_seconds
        self.poll_seconds = poll_seconds
        self.clock = clock
        self.clock_seconds = clock_seconds
        # A flag, not a threading.Event: stop() runs in signal handlers, and Event.set() there can
        # deadlock on the lock that the interrupted Event.wait() holds.
        self._stopping = False
        self._logged_at: dict[str, float] = {}  # when each kind of unexpected error was last logged

    @property
    def restarts(self) -> int:
        return sum(cluster.restarts for cluster in self.clusters)

    def stop(self) -> None:
        self._stopping = True

    def run(self) -> None:
        next_clock = time.monotonic()
        while not self._stopping:
            now = time.monotonic()
            for cluster in self.clusters:
                self._guarded(f"supervising the {cluster.name} workers", self._supervise, cluster, now)
            wake = now + self.poll_seconds
            if self.clock is not None:
                if time.monotonic() >= next_clock:
                    self._guarded("the clock", self.clock)
                    next_clock = time.monotonic() + self.clock_seconds
                wake = min(wake, next_clock)
            for cluster in self.clusters:
                if cluster.popen is None:
                    wake = min(wake, cluster.start_at)
            self._sleep(wake - time.monotonic())
        log.info("stopping the workers")
        self._end([cluster.popen for cluster in self.clusters], grace_seconds=self.grace_seconds)
        log.info("workers stopped")

    def _supervise(self, cluster: Supervised, now: float) -> None:
        """Start a cluster that is due to start; end a broken one, to be started after a delay."""
        if cluster.popen is None:
            if now >= cluster.start_at:
                self._start(cluster)
            return
        reason = self._broken(cluster, now)
        if reason is None:
            return
        log.critical("the %s workers broke (%s); ending every process of their cluster and starting it anew",
                     cluster.name, reason)  # fmt: skip
        self._end([cluster.popen], grace_seconds=0)
        cluster.popen = None
        healthy = cluster.started is not None and now - cluster.started >= HEALTHY_SECONDS
        cluster.quick_failures = 0 if healthy else cluster.quick_failures + 1
        cluster.start_at = time.monotonic() + restart_delay(cluster.quick_failures)

    def _guarded(self, what: str, call: Callable, *args) -> None:
        """Call, logging an unexpected error (once a minute per kind while it lasts) instead of ending
        the supervisor: its end would take every cluster with it (PDEATHSIG)."""
        try:
            call(*args)
        except Exception:
            now = time.monotonic()
            if now - self._logged_at.get(what, -LOG_EVERY_SECONDS) >= LOG_EVERY_SECONDS:
                self._logged_at[what] = now
                log.exception("%s failed; the supervisor goes on and tries again", what)

    def _start(self, cluster: Supervised) -> None:
        if cluster.started is not None:
            cluster.restarts += 1
        cluster.popen = subprocess.Popen(
            cluster.argv, cwd=self.cwd, env=cluster.env, process_group=0, preexec_fn=ended_with(os.getpid())
        )
        cluster.started = time.monotonic()
        cluster.watch = DeadWatch(self.stuck_seconds)
        log.info("%s workers started (cluster pid %s)", cluster.name, cluster.popen.pid)

    def _broken(self, cluster: Supervised, now: float) -> str | None:
        """Why the cluster must be started anew, or None while it is sound. Its processes are read
        from /proc a quarter of ``stuck_seconds`` apart at most (5 s): not on every poll, where
        three clusters cost the supervisor 5 ms of CPU each half second, the CPU that pages need
        on a 2-core machine (issue 27)."""
        child = cluster.popen
        code = child.poll()
        if code is not None:
            return describe_exit(code)
        if now < cluster.watched_at + min(WATCH_SECONDS, self.stuck_seconds / 4):
            return None
        cluster.watched_at = now
        members = [p for p in process_tree(child.pid) if p.pgrp == child.pid]  # local pods have their own
        stuck = cluster.watch.stuck(members, child.pid, now)
        if stuck is not None:
            return f"process {stuck.pid} has been dead and unreaped for {self.stuck_seconds:g} s"
        return None

    def _sleep(self, seconds: float) -> bool:
        """Sleep, waking early when asked to stop; whether asked to stop."""
        deadline = time.monotonic() + seconds
        while not self._stopping and (left := deadline - time.monotonic()) > 0:
            time.sleep(min(left, 0.1))
        return self._stopping

    def _end(self, children: list[subprocess.Popen | None], *, grace_seconds: float) -> None:
        """End every process of the children's groups: SIGTERM to each cluster first when there is grace."""
        children = [child for child in children if child is not None]
        if grace_seconds > 0:
            for child in children:
                if child.poll() is None:
                    child.send_signal(signal.SIGTERM)  # django-q2 lets each worker finish its task
            deadline = time.monotonic() + grace_seconds
            for child in children:
                try:
                    child.wait(timeout=max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    log.warning("cluster %s did not stop within %g s; killing it", child.pid, grace_seconds)
        for child in children:
            try:
                os.killpg(child.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for child in children:
            child.wait()
        deadline = time.monotonic() + 30
        while left := [p for child in children for p in group_members(child.pid)]:
            if time.monotonic() > deadline:
                log.error("processes %s of an old cluster outlived SIGKILL", [p.pid for p in left])
                return
            time.sleep(0.05)
