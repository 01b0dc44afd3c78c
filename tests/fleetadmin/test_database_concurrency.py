"""Several processes writing at once: no "database is locked", and every page done once."""

from __future__ import annotations

import json
import select
import subprocess
import sys

from ocrjobs.models import Document, Job, Page
from tests.assertions import assert_every_page_done_once
from tools.processes import REPO, child_env, wait_for

WORKERS = 4
PAGES = 400


def test_concurrent_claimers_finish_every_page_once_without_lock_errors(transactional_db, local_pool, tmp_path):
    job = Job.objects.create(pool=local_pool)
    document = Document.objects.create(job=job, position=0, name="d.pdf", kind="pdf", source=f"jobs/{0}/0/source.pdf",
                                       size_bytes=1, page_count=PAGES)  # fmt: skip
    Page.objects.bulk_create([Page(job=job, document=document, pool=local_pool, number=n) for n in range(1, PAGES + 1)])
    env = child_env(tmp_path)
    go = tmp_path / "go"
    procs = [
        subprocess.Popen(
            [sys.executable, "tests/fleetadmin/claim_worker.py", str(local_pool.pk), "3", str(go)],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for _ in range(WORKERS)
    ]
    ready: set[int] = set()

    def all_ready() -> bool:
        """Read each worker's ``ready`` line once it has one to read, without blocking."""
        waiting = [proc for proc in procs if proc.pid not in ready]
        readable, _, _ = select.select([proc.stdout for proc in waiting], [], [], 0)
        for proc in waiting:
            if proc.stdout in readable:
                line = proc.stdout.readline()
                assert line == "ready\n", f"{line!r}\n{proc.communicate(timeout=30)[1]}"
                ready.add(proc.pid)
        return len(ready) == len(procs)

    # A start barrier: Django's start-up takes seconds, and not the same in each worker; none
    # claims a page before all are set up, so that they overlap.
    try:
        wait_for(all_ready, 120, "a worker never said ready")
    except BaseException:
        for proc in procs:
            proc.kill()
            proc.wait()
        raise
    go.touch()
    outputs = [proc.communicate(timeout=240) for proc in procs]
    for proc, (_out, err) in zip(procs, outputs, strict=True):
        assert "database is locked" not in err
        assert proc.returncode == 0, err
    reports = [json.loads(out) for out, _ in outputs]
    assert sum(r["completed"] for r in reports) == PAGES
    assert sum(1 for r in reports if r["completed"]) >= 2, "the workers did not overlap; the test proves nothing"
    assert_every_page_done_once(job, job_done=False)  # its document stays pending: the job never finishes
