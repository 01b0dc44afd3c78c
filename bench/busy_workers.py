"""Busy workers: one-page jobs while 64 RunPod boots are in flight (issue 11, invariant 15).

    .venv/bin/python bench/busy_workers.py [--database-url postgres://...] [--boots 64 --boot-seconds 120]
        [--every 3 --idle-jobs 8] [--q-workers 4]

A RunPod simulator whose pods take ``--boot-seconds`` to come up, a real daphne front and the
real workers (``manage.py workers``: a django-q2 cluster per work class, default sizes) on a
fresh database. First, with nothing else to do, one-page PDFs go to the local tesseract pool
(its pod kept warm) one every ``--every`` seconds: the idle latency (job created to done).
Then a scale request asks for ``--boots`` RunPod pods (``max_parallel_boots`` as many), and the
same one-page jobs go on being submitted while the boots are in flight, until the scale request
has ended (or ``--boot-seconds`` × 2 + 60 s have passed).

Prints:
- the one-page jobs' latency p50 and p95, busy against idle (a job not done when the run ends
  counts with its time so far, and the figure is then a lower bound, printed ">=");
- worker processes per work class: configured, and the most busy at once during each phase
  (from the workers' log: a worker is busy from "processing" to its task's "Processed"/"Failed");
- how long the scale request took to reach its target (ready pods), against the boot time;
- the cores each process used during the busy phase (CpuMeter: front, workers, simulator,
  the benchmark itself, other processes);
and ends with one JSON line.

Goals, each named in the JSON's "goal": counted ones, every_job_done; the boots need no more
worker processes than 8 boots would: workers_within_class_sizes (the classes' sizes do not
depend on the boots) and short_workers_never_all_busy (the boots hold no short-task worker);
scale_target_reached (every pod asked for ready). Times, on this 2-core machine, which CI does
not assert: busy_latency_p95 (busy p95 <= 1.5 × idle p95 and <= idle p95 + 5 s) and
scale_seconds (the target reached within one boot time plus ``SCALE_GOAL_MARGIN_S``).
CI's size (tests/bench/test_busy_workers.py):

    .venv/bin/python bench/busy_workers.py --boots 8 --boot-seconds 10 --every 1 --idle-jobs 3

Also control_plane_cpu_within_ceiling: the front's and the workers' CPU in the busy phase a
one-page job (control_plane_cpu_ms_per_page, bench/_cpu.py; the local pod's is carved out) under
CPU_CEILING_MS_PER_PAGE, which CI asserts; the idle phase's is printed beside.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from datetime import datetime
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench._cpu import CEILING_GOAL, control_plane_seconds, cpu_line, local_pod_roles, per_unit, within_ceiling
from bench._setup import bench_session
from bench.control_plane import CpuMeter
from tools.processes import Children, child_env, start_front, start_workers

API_KEY = "bench-key"
GPU = "BUSY-GPU"
LATENCY_RATIO_GOAL = 1.5
LATENCY_EXTRA_GOAL_S = 5.0
SCALE_GOAL_MARGIN_S = 10.0
# The front's and the workers' CPU a one-page job while the boots are in flight at CI's size (8
# boots of 10 s, a job a second): 321 and 267 ms (SQLite; the test runs once). About three times.
CPU_CEILING_MS_PER_PAGE = 1000.0
# Which work class runs a task, by its function (fleetadmin/clusters.py routes them so).
CLASS_OF = {"ocrjobs.tasks.dispatch_pool": "dispatch", "pods.tasks.advance_pods": "passes",
            "ocrjobs.output_tasks.build_searchable_pdfs": "outputs",
            "ocrjobs.output_tasks.request_searchable_pdfs": "outputs"}  # fmt: skip
PROCESSING = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) INFO django-q (\d+) \S+ processing (.+) '([\w.]+)'")
ENDED = re.compile(
    r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) \w+ django-q \d+ (?:Processed|Failed) '([\w.]+)' \((.*?)\)"
)


def sim_config(args) -> dict:
    return {
        "api_key": API_KEY,
        "boot_delay_s": args.boot_seconds,
        "model_load_s": 1.0,
        "gpu_types": [{"id": GPU, "displayName": "busy workers bench", "memoryInGb": 48, "securePrice": 0.5,
                       "communityPrice": 0.3, "capacity": {"SECURE": {"DC-1": args.boots * 2}}}],
    }  # fmt: skip


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))], 2)


def _stamp(text: str) -> float:
    return datetime.strptime(text, "%Y-%m-%d %H:%M:%S,%f").timestamp()  # the log's local time


def busy_intervals(log_path: Path) -> dict[str, list[tuple[float, float]]]:
    """Per work class, when each task held a worker: from the worker's "processing" line to the
    monitor's "Processed"/"Failed" line for the same task (matched in order by function and name),
    or to the same worker's next "processing" line if that came first (the monitor logs a moment
    after the worker is free); a task still running at the end holds its worker until now."""
    tasks: list[list] = []  # [start, end or None, worker pid, work class]
    open_by_task: dict[tuple[str, str], list[list]] = {}
    last_by_worker: dict[str, list] = {}
    for line in log_path.read_text(errors="replace").splitlines():
        if match := PROCESSING.match(line):
            stamp, pid, name, func = match.groups()
            task = [_stamp(stamp), None, pid, CLASS_OF.get(func, "short")]
            if (previous := last_by_worker.get(pid)) is not None and previous[1] is None:
                previous[1] = task[0]
            last_by_worker[pid] = task
            open_by_task.setdefault((func, name), []).append(task)
            tasks.append(task)
        elif match := ENDED.match(line):
            stamp, func, name = match.groups()
            if waiting := open_by_task.get((func, name)):
                task = waiting.pop(0)
                task[1] = task[1] if task[1] is not None else _stamp(stamp)
    now = time.time()
    from fleetadmin.clusters import CLASSES

    intervals: dict[str, list[tuple[float, float]]] = {name: [] for name in CLASSES}
    for start, end, _, work_class in tasks:
        intervals[work_class].append((start, now if end is None else end))
    return intervals


def most_busy(intervals: list[tuple[float, float]], start: float, end: float) -> int:
    """The most tasks that held a worker at once between ``start`` and ``end``."""
    events = sorted([(max(a, start), 1) for a, b in intervals if a < end and b > start]
                    + [(min(b, end), -1) for a, b in intervals if a < end and b > start])  # fmt: skip
    busy = peak = 0
    for _, change in events:
        busy += change
        peak = max(peak, busy)
    return peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--boots", type=int, default=64, help="RunPod pods the scale request asks for")
    parser.add_argument("--boot-seconds", type=float, default=120.0, help="the simulator's boot delay")
    parser.add_argument("--every", type=float, default=3.0, help="seconds between one-page jobs")
    parser.add_argument("--idle-jobs", type=int, default=8, help="one-page jobs measured on the idle system")
    parser.add_argument("--q-workers", type=int, default=0, help="short-task workers (default: the setting's)")
    parser.add_argument("--database-url", default=os.environ.get("DATABASE_URL", ""))
    args = parser.parse_args()
    with bench_session("busy-workers", database_url=args.database_url, simulator=sim_config(args), api_key=API_KEY,
                       release_pods=True) as (children, _):  # fmt: skip
        run(args, children)


def run(args, children: Children) -> None:
    import httpx
    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.db import connection
    from django.utils import timezone

    from accounts.models import ApiToken
    from fleetadmin.clusters import work_classes
    from ocrjobs.models import Job
    from pods.models import Pod, Pool, ScaleRequest
    from tests.factories import pdf_bytes

    local = Pool.objects.get(key="local")
    Pool.objects.filter(pk=local.pk).update(min_pods=1, idle_seconds=3600)  # kept warm: no boot in a job's time
    pool = Pool.objects.create(
        key="busy", provider="runpod", max_pods=args.boots, max_parallel_boots=args.boots, lanes_per_pod=2,
        idle_seconds=3600,
        config={"image": "ghcr.io/example/fleetadmin-pod:1",
                "candidates": [{"gpu_types": [GPU], "cloud_type": "SECURE", "data_centers": ["DC-1"]}]},
    )  # fmt: skip
    user = get_user_model().objects.create_user("bench", is_staff=True)  # (admin tokens are staff's)
    submit = {"Authorization": f"Bearer {ApiToken.issue(user=user, name='bench', scopes=['submit'])[1]}"}
    admin = {"Authorization": f"Bearer {ApiToken.issue(user=user, name='bench', scopes=['admin'])[1]}"}
    document = pdf_bytes([["A single page, read while the fleet boots."]])
    env = child_env(**({"Q_WORKERS": str(args.q_workers)} if args.q_workers else {}))
    connection.close()
    front, front_url = start_front(env, children.log_dir, own_session=False)
    children.add(front)
    workers = children.add(start_workers(env, children.log_dir, own_session=False))
    sizes = {c.name: c.workers for c in work_classes()}  # as the workers counted them at start
    if args.q_workers:
        sizes["short"] = args.q_workers

    def alive() -> None:
        for child in (workers, front):
            if not child.alive():
                raise SystemExit(f"{child.name} exited:\n{child.tail()}")

    def submit_job() -> int:
        response = httpx.post(f"{front_url}/v1/jobs", headers=submit, data={"pool": "local"},
                              files={"files": ("page.pdf", document, "application/pdf")}, timeout=60)  # fmt: skip
        response.raise_for_status()
        return response.json()["id"]

    def latencies(job_ids: list[int]) -> tuple[list[float], int]:
        """Each job's latency, and how many were not done: theirs is a lower bound (until now)."""
        rows = Job.objects.filter(pk__in=job_ids).values_list("created_at", "finished_at", "status")
        now, values, undone = timezone.now(), [], 0
        for created, finished, status in rows:
            done = status == Job.Status.DONE and finished is not None
            undone += not done
            values.append(((finished if done else now) - created).total_seconds())
        return values, undone

    def wait_done(job_ids: list[int], seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            alive()
            if Job.objects.filter(pk__in=job_ids).exclude(finished_at=None).count() >= len(job_ids):
                return
            time.sleep(0.5)

    # Warm-up: the local pod boots and joins; its first page is not measured.
    wait_done([submit_job()], 300)
    if not Pod.objects.filter(pool=local, state=Pod.State.READY).exists():
        raise SystemExit(f"the local pod never came up:\n{workers.tail()}")

    # Idle.
    meter = CpuMeter(children)
    idle_cpu_before = meter.read(local_pod_roles())
    idle_started = time.time()
    idle_jobs = []
    for _ in range(args.idle_jobs):
        idle_jobs.append(submit_job())
        time.sleep(args.every)
    wait_done(idle_jobs, 120)
    idle_ended = time.time()
    idle_cpu_s = control_plane_seconds(idle_cpu_before[0], meter.read(local_pod_roles())[0])

    # Busy: the scale request, and the same jobs while its boots are in flight.
    cap = args.boot_seconds * 2 + 60
    cpu_before, cpu_at = meter.read(local_pod_roles()), time.monotonic()
    busy_started = time.time()
    response = httpx.post(f"{front_url}/v1/runpod/scale", headers=admin,
                          json={"pool": pool.key, "pods": args.boots, "wait_s": 0}, timeout=60)  # fmt: skip
    response.raise_for_status()
    request_id = response.json()["id"]
    busy_jobs = []
    booting_seen = 0
    scale_seconds = None
    while time.time() - busy_started < cap:
        alive()
        busy_jobs.append(submit_job())
        booting_seen = max(booting_seen, Pod.objects.filter(pool=pool, state=Pod.State.BOOTING).count())
        ready = Pod.objects.filter(pool=pool, state=Pod.State.READY).count()
        if scale_seconds is None and ready >= args.boots:
            scale_seconds = round(time.time() - busy_started, 1)
        if ScaleRequest.objects.get(pk=request_id).state != ScaleRequest.State.PENDING:
            break
        time.sleep(args.every)
    wait_done(busy_jobs, 60)
    cpu_after = meter.read(local_pod_roles())
    cores, _ = CpuMeter.spent(cpu_before, cpu_after, time.monotonic() - cpu_at)
    busy_ended = time.time()
    request = ScaleRequest.objects.get(pk=request_id)
    ready = Pod.objects.filter(pool=pool, state=Pod.State.READY).count()
    if scale_seconds is None and ready >= args.boots and request.finished_at:
        scale_seconds = round(request.finished_at.timestamp() - busy_started, 1)

    (idle, idle_undone), (busy, undone) = latencies(idle_jobs), latencies(busy_jobs)
    intervals = busy_intervals(workers.log_path)
    in_use = {
        phase: {name: most_busy(spans, start, end) for name, spans in intervals.items()}
        for phase, (start, end) in {"idle": (idle_started, idle_ended), "busy": (busy_started, busy_ended)}.items()
    }
    idle_p95, busy_p95 = percentile(idle, 0.95), percentile(busy, 0.95)
    # The front's and the workers' CPU over the busy phase (the local pod's is the engine's, carved
    # out), per one-page job done in it: the boots' passes are in it, the load this is about. The
    # idle phase's, beside it, is a one-page job's alone.
    cpu = per_unit("page", control_plane_seconds(cpu_before[0], cpu_after[0]), len(busy) - undone,
                   CPU_CEILING_MS_PER_PAGE)  # fmt: skip
    idle_ms_per_page = round(idle_cpu_s * 1000 / (len(idle) - idle_undone), 3) if len(idle) > idle_undone else None
    goal = {
        # Counted, the same on any machine:
        "every_job_done": undone == 0 == idle_undone,
        "workers_within_class_sizes": all(in_use["busy"][name] <= size for name, size in sizes.items()),
        # The boots take no short-task worker: those are never all busy (on the old model, boots
        # held them all, and 64 boots would have needed 64 of them to be in flight at once).
        "short_workers_never_all_busy": in_use["busy"]["short"] < sizes["short"],
        "scale_target_reached": ready >= args.boots,
        # CPU time, which the machine's load barely moves: a generous ceiling CI asserts.
        CEILING_GOAL: within_ceiling(cpu),
        # Times (this machine's): in the JSON, not asserted by CI.
        "busy_latency_p95": idle_p95 is not None and busy_p95 is not None
        and busy_p95 <= LATENCY_RATIO_GOAL * idle_p95 and busy_p95 <= idle_p95 + LATENCY_EXTRA_GOAL_S,
        "scale_seconds": scale_seconds is not None and scale_seconds <= args.boot_seconds + SCALE_GOAL_MARGIN_S,
    }  # fmt: skip
    latency_met = goal["every_job_done"] and goal["busy_latency_p95"]
    workers_met = goal["workers_within_class_sizes"] and goal["short_workers_never_all_busy"]
    scale_met = goal["scale_target_reached"] and goal["scale_seconds"]
    result = {
        "benchmark": "busy_workers",
        "database": connection.vendor,
        "boots": args.boots,
        "boot_seconds": args.boot_seconds,
        "boots_in_flight_max": booting_seen,
        "job_every_s": args.every,
        "idle": {"jobs": len(idle_jobs), "not_done": idle_undone, "p50_s": percentile(idle, 0.5), "p95_s": idle_p95},
        "busy": {"jobs": len(busy_jobs), "not_done": undone, "p50_s": percentile(busy, 0.5), "p95_s": busy_p95},
        "worker_processes": {"configured": sizes, "most_busy_idle": in_use["idle"], "most_busy_busy": in_use["busy"]},
        "scale_request": {"state": request.state, "ready": ready, "seconds_to_target": scale_seconds},
        "cores_used_busy_phase": cores,
        **cpu,
        "idle_control_plane_cpu_ms_per_page": idle_ms_per_page,
        "pass_interval_s": settings.PASS_INTERVAL_SECONDS,
        "latency_met": latency_met,
        "workers_met": workers_met,
        "scale_met": scale_met,
        "goal": goal,
        "goal_met": all(goal.values()),
    }
    print(f"database {connection.vendor}; {args.boots} RunPod boots of {args.boot_seconds:g} s (max_parallel_boots "
          f"{args.boots}; at most {booting_seen} booting at once); one-page jobs on the local pool every "
          f"{args.every:g} s")  # fmt: skip
    for phase, values, missing in (("idle", idle, idle_undone), ("busy", busy, undone)):
        bound = ">= " if missing else ""  # a job not done counts with its time so far
        print(f"{phase:>5}: {len(values) - missing}/{len(values)} jobs done, "
              f"latency p50 {bound}{percentile(values, 0.5)} s, p95 {bound}{percentile(values, 0.95)} s")  # fmt: skip
    print(f"goal: busy p95 <= {LATENCY_RATIO_GOAL:g} × idle and <= idle + {LATENCY_EXTRA_GOAL_S:g} s, every job done: "
          f"{'met' if latency_met else 'NOT met'}")  # fmt: skip
    for name, size in sizes.items():
        print(f"worker processes, {name}: {size} configured; most busy at once idle {in_use['idle'][name]}, "
              f"busy {in_use['busy'][name]}")  # fmt: skip
    print(f"goal: the boots hold no short-task worker (never all {sizes['short']} busy), whatever their number: "
          f"{'met' if workers_met else 'NOT met'}")  # fmt: skip
    goal_s = args.boot_seconds + SCALE_GOAL_MARGIN_S
    print(f"scale request: {request.state}, {ready}/{args.boots} ready; target reached after "
          f"{'-' if scale_seconds is None else scale_seconds} s (goal <= {goal_s:g} s: "
          f"{'met' if scale_met else 'NOT met'})")  # fmt: skip
    print(cpu_line(cpu) + f" in the busy phase; idle, {idle_ms_per_page} ms a page")
    print("cores used during the busy phase: " + ", ".join(f"{k} {v}" for k, v in sorted(cores.items())))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
