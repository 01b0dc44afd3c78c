"""Uploads: the front alone taking in bench/ingest.py's documents, its CPU per MB and per page.

    .venv/bin/python bench/uploads.py [--database-url postgres://...] [--pdfs 200 --images 500]
        [--docs-per-job 10 --clients 4]

The same documents and requests as bench/ingest.py (multipart ``POST /v1/jobs`` to a real daphne
front), with no workers running: the jobs stay pending, so the front's CPU seconds are its own,
not shared with splits and dispatch in the database or on the cores. That makes the figure steady
enough to compare changes to the front with (bench/ingest.py varies ~40% from run to run).

Prints the front's CPU seconds (daphne's process, user + system, and each) for the whole run, per
page and per MB, and the upload rate; the closing JSON line has ``front_cpu_s``, ``front_cpu_ms_per_page``
and ``upload_mb_s``, and its "goal" names what is counted: every_submission_accepted,
every_job_stored and every_document_stored (each document's row, its bytes summed). CI's size
(tests/bench/test_uploads.py):

    .venv/bin/python bench/uploads.py --pdfs 10 --pages-per-pdf 10 --images 20 --docs-per-job 3

Also control_plane_cpu_within_ceiling, asserted by CI: the front's CPU a page (the control plane
here: control_plane_cpu_ms_per_page, bench/_cpu.py) under CPU_CEILING_MS_PER_PAGE.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench._cpu import CEILING_GOAL, cpu_line, per_unit, within_ceiling
from bench._setup import bench_session
from bench.control_plane import API_KEY, CpuMeter
from bench.ingest import add_document_options, make_documents, ready_pods, sim_config, submit_all
from tools.processes import Children, child_env, start_front

# The front's CPU a page at CI's size (30 documents, 120 pages, 3 a request): 3.67 and 3.50 ms on
# SQLite, 5.58 on PostgreSQL. About three times the most.
CPU_CEILING_MS_PER_PAGE = 18.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_document_options(parser)
    parser.add_argument("--pods", type=int, default=1, help="pods of the pool (its forecast reads them)")
    parser.add_argument("--lanes", type=int, default=16)
    parser.add_argument("--database-url", default=os.environ.get("DATABASE_URL", ""))
    args = parser.parse_args()
    with bench_session("uploads", database_url=args.database_url, simulator=sim_config(args), api_key=API_KEY) as (
        children,
        url,
    ):
        run(args, children, url)


def run(args, children: Children, sim_url: str) -> None:
    from django.contrib.auth import get_user_model
    from django.db import connection
    from django.db.models import Sum

    from accounts.models import ApiToken
    from ocrjobs.models import Document, Job

    ready_pods(args, sim_url)
    user, _ = get_user_model().objects.get_or_create(username="uploads")
    token = ApiToken.issue(user=user, name="uploads benchmark", scopes=["read", "submit"])[1]
    documents = make_documents(args)
    pages_total = sum(pages for _, _, pages in documents)
    document_bytes = sum(len(data) for _, data, _ in documents)
    jobs = [documents[i : i + args.docs_per_job] for i in range(0, len(documents), args.docs_per_job)]
    connection.close()
    front, front_url = start_front(child_env(Q_CLUSTER_NAME=f"uploads-{uuid.uuid4().hex[:6]}"), children.log_dir,
                                   own_session=False)  # fmt: skip
    children.add(front)
    meter = CpuMeter(children)
    time.sleep(1.0)
    before, times_before = meter.read()[0].get("daphne", 0.0), cpu_times(front.pid)
    submitted = submit_all(front_url, token, jobs, args.clients)
    front_cpu_s = meter.read()[0].get("daphne", 0.0) - before
    user_s, system_s = (after - earlier for after, earlier in zip(cpu_times(front.pid), times_before, strict=True))
    refused = [answer for answer in submitted["answers"] if answer[0] != 201]
    if refused:
        print(f"{len(refused)} submissions refused, e.g. {refused[0]}", file=sys.stderr)
    stored = Document.objects.count()
    stored_bytes = Document.objects.aggregate(total=Sum("size_bytes"))["total"] or 0
    jobs_stored = Job.objects.count()
    # No workers run: the control plane is the front alone.
    cpu = per_unit("page", front_cpu_s, pages_total, CPU_CEILING_MS_PER_PAGE)
    goal = {
        # Counted: every request answered 201, and what it carried is in the database.
        "every_submission_accepted": len(submitted["answers"]) == len(jobs) and not refused,
        "every_job_stored": jobs_stored == len(jobs),
        "every_document_stored": stored == len(documents) and stored_bytes == document_bytes,
        # CPU time, which the machine's load barely moves: a generous ceiling CI asserts.
        CEILING_GOAL: within_ceiling(cpu),
    }
    upload_s = submitted["seconds"]
    result = {
        "benchmark": "uploads",
        "database": connection.vendor,
        "documents": len(documents),
        "documents_stored": stored,
        "document_bytes_stored": stored_bytes,
        "jobs_stored": jobs_stored,
        "pages": pages_total,
        "document_bytes": document_bytes,
        "requests": len(jobs),
        "clients": args.clients,
        "front_cpu_s": round(front_cpu_s, 2),
        "front_cpu_ms_per_page": round(front_cpu_s * 1000 / pages_total, 3),
        "front_cpu_ms_per_mb": round(front_cpu_s * 1000 / (document_bytes / 1e6), 3),
        "front_user_s": round(user_s, 2),
        "front_system_s": round(system_s, 2),
        **cpu,
        "upload_seconds": round(upload_s, 2),
        "upload_mb_s": round(document_bytes / upload_s / 1e6, 1),
        "goal": goal,
        "goal_met": all(goal.values()),
    }
    print(f"database {connection.vendor}; {len(documents)} documents, {pages_total} pages, "
          f"{document_bytes / 1e6:.1f} MB in {len(jobs)} requests, {args.clients} at a time; no workers")  # fmt: skip
    print(f"front CPU: {front_cpu_s:.2f} s = {result['front_cpu_ms_per_page']} ms/page, "
          f"{result['front_cpu_ms_per_mb']} ms/MB (user {user_s:.2f} s, system {system_s:.2f} s)")  # fmt: skip
    print(cpu_line(cpu))
    print(f"uploads: {document_bytes / 1e6:.1f} MB accepted in {upload_s:.2f} s = {result['upload_mb_s']} MB/s")
    print(f"stored: {jobs_stored}/{len(jobs)} jobs, {stored}/{len(documents)} documents, "
          f"{stored_bytes}/{document_bytes} bytes; {len(refused)} requests refused")  # fmt: skip
    print(json.dumps(result))


def cpu_times(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of the process so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) / CpuMeter.TICK, int(fields[12]) / CpuMeter.TICK


if __name__ == "__main__":
    main()
