"""The dashboard push's reads one by one: each statement's time, and its plan.

    .venv/bin/python bench/dashboard_reads.py [--database-url postgres://...] [--explain]

Seeds what bench/status_history.py seeds (a week of pages, then the fleet: 500 ready pods and
300 jobs), makes the staff push as the broadcaster does (pods.dashboard.render_payloads, its
sections kept from the push before) many times, and prints for each statement of a push its
median milliseconds as the client waits for it (a connection.execute_wrapper), then the
push's own median; with ``--explain``, each statement's plan (PostgreSQL: EXPLAIN (ANALYZE,
BUFFERS); SQLite: EXPLAIN QUERY PLAN).

The closing JSON line's "goal" names each goal, both counted: push_statements (a push makes at
most 7 statements, whatever the fleet's size and history: tests/pods/test_dashboard.py holds
the same bound on a small fleet) and history_not_read (no statement of a push has a plan that
reads the whole page table: bench/_plans.py).

Also control_plane_cpu_within_ceiling: a push's median CPU (control_plane_cpu_ms_per_push,
bench/_cpu.py) under bench/status_history.py's CPU_CEILING_MS_PER_PUSH, which CI asserts.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench._cpu import CEILING_GOAL, control_plane_cpu, cpu_line, within_ceiling
from bench._plans import explain, history_reads
from bench._setup import django_for_bench
from bench.status_history import CPU_CEILING_MS_PER_PUSH, populate, populate_fleet, set_index

# The pods' spend, the last minutes' pages, the boot attempts, the failed pods, the loops, the
# jobs, their pages: one statement each.
PUSH_STATEMENTS_GOAL = 7


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pages", type=int, default=20_000)
    parser.add_argument("--recent", type=int, default=600)
    parser.add_argument("--fleet-pods", type=int, default=500)
    parser.add_argument("--fleet-jobs", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--explain", action="store_true")
    parser.add_argument("--database-url", default=os.environ.get("DATABASE_URL", ""))
    args = parser.parse_args()
    django_for_bench("dashboard-reads", database_url=args.database_url)
    from django.db import connection

    from pods import dashboard
    from pods.selectors import fleet_status_snapshot

    populate(args.pages, args.recent)
    populate_fleet(args.fleet_pods, args.fleet_jobs)
    set_index(True)  # the schema as deployed (and ANALYZE)
    fleet_status_snapshot.clear()

    timings: dict[str, list[float]] = defaultdict(list)
    statements: dict[str, tuple] = {}
    pushes: list[float] = []
    cpus: list[float] = []  # the pushes' CPU ms (this thread's: the front's, not PostgreSQL's)
    executed = [0]  # statements sent so far
    per_push: list[int] = []

    def timer(execute, sql, params, many, context):
        executed[0] += 1
        started = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            timings[sql].append((time.perf_counter() - started) * 1000)
            statements.setdefault(sql, params)

    def push() -> float:
        fleet_status_snapshot.get()  # (refreshed ahead on a thread of its own in the front)
        started, before, cpu = time.perf_counter(), executed[0], time.thread_time()
        dashboard.render_payloads(staff=True, user_ids=[])
        cpus.append((time.thread_time() - cpu) * 1000)
        per_push.append(executed[0] - before)
        return (time.perf_counter() - started) * 1000

    push()
    for _ in range(3):
        push()
    per_push.clear()  # (the pushes above ran without the wrapper)
    cpus.clear()
    with connection.execute_wrapper(timer):
        for _ in range(args.repeats):
            pushes.append(push())
    snapshot_sql = set()
    with connection.execute_wrapper(timer):
        timings_before = {sql: len(v) for sql, v in timings.items()}
        fleet_status_snapshot.get()
        snapshot_sql = {sql for sql, v in timings.items() if len(v) != timings_before.get(sql, 0)}
    total = 0.0
    print(f"{connection.vendor}: {len(timings)} statements")
    for sql, samples in timings.items():
        if sql in snapshot_sql:
            continue
        median = statistics.median(samples)
        total += median * len(samples) / args.repeats
        print(f"{median:7.3f} ms x{len(samples) / args.repeats:.1f}  {' '.join(sql.split())[:150]}")
    print(f"reads {total:.2f} ms of a push's median {statistics.median(pushes):.2f} ms")
    readers = []
    for sql, params in statements.items():
        if sql not in snapshot_sql and (
            steps := history_reads(connection.vendor, sql, explain(connection, sql, params))
        ):
            readers.append({"sql": " ".join(sql.split())[:300], "steps": steps})
            print(f"reads the whole page table: {'; '.join(steps)}: {' '.join(sql.split())[:150]}")
    most = max(per_push)
    # No pages are read here: a push is the unit of work.
    cpu = control_plane_cpu("push", statistics.median(cpus), CPU_CEILING_MS_PER_PUSH)
    print(cpu_line(cpu))
    print(f"statements a push: at most {most} (goal <= {PUSH_STATEMENTS_GOAL}); "
          f"that read the whole page table: {len(readers)} (goal: none)")  # fmt: skip
    if args.explain:
        for sql, params in statements.items():
            if sql in snapshot_sql:
                continue
            print("\n" + "=" * 100 + "\n" + " ".join(sql.split())[:400])
            with connection.cursor() as cursor:
                if connection.vendor == "postgresql":
                    cursor.execute("EXPLAIN (ANALYZE, BUFFERS) " + sql, params)
                else:
                    cursor.execute("EXPLAIN QUERY PLAN " + sql, params)
                for row in cursor.fetchall():
                    print("   ", " | ".join(str(c) for c in row))
    goal = {"push_statements": most <= PUSH_STATEMENTS_GOAL, "history_not_read": not readers,
            CEILING_GOAL: within_ceiling(cpu)}  # fmt: skip
    print(json.dumps({"benchmark": "dashboard_reads", "database": connection.vendor, "pages": args.pages,
                      "fleet_pods": args.fleet_pods, "fleet_jobs": args.fleet_jobs, "pushes": args.repeats,
                      "push_median_ms": round(statistics.median(pushes), 2), "reads_ms": round(total, 2),
                      "push_statements": most, "push_statements_limit": PUSH_STATEMENTS_GOAL, **cpu,
                      "history_readers": readers, "goal": goal, "goal_met": all(goal.values())}))  # fmt: skip


if __name__ == "__main__":
    main()
