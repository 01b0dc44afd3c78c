"""Cancelling a job stops what it costs (issue 11): cancelled while its split runs, none of its
pages reaches a pod, all end cancelled, and none counts as demand. The split runs in a thread
held at a batch boundary; the pages go through a whole dispatch loop to a simulator pod, which
counts what it received."""

from __future__ import annotations

import threading

from django.db import connection

from ocrjobs.models import Document, Page
from ocrjobs.selectors import PoolBacklog, pool_backlog
from ocrjobs.services import split as split_services
from ocrjobs.services.jobs import job_cancel
from ocrjobs.services.split import document_split
from pods.services.scaler import pool_demand
from tests.factories import PAGES_TRUTH, image_bytes, pdf_bytes
from tests.ocrjobs.helpers import run_dispatch_loop, split, submit

GUARD = 60  # seconds, against hangs only


def test_a_job_cancelled_mid_split_sends_no_page_to_a_pod_and_counts_as_no_demand(sim_pool, ordinary_user, monkeypatch):
    monkeypatch.setattr(split_services, "SPLIT_BATCH", 2)
    job = submit(ordinary_user, {"large.pdf": pdf_bytes(PAGES_TRUTH * 3)}, pool_key=sim_pool.pool.key)  # 5 batches
    document = job.documents.get()
    at_boundary, go_on = threading.Event(), threading.Event()
    nudge = split_services.nudge_scaler

    def held_after_the_first_batch(pool_id: int) -> None:
        if not at_boundary.is_set():
            at_boundary.set()
            assert go_on.wait(GUARD)
        nudge(pool_id)

    monkeypatch.setattr(split_services, "nudge_scaler", held_after_the_first_batch)

    def splitting() -> None:
        try:
            document_split(document_id=document.pk)
        finally:
            connection.close()  # this thread's own

    thread = threading.Thread(target=splitting)
    thread.start()
    try:
        assert at_boundary.wait(GUARD)
        assert job.pages.count() == 2  # the first batch saved, the other seven pages still to split
        job_cancel(job=job)
    finally:
        go_on.set()
        thread.join(GUARD)

    assert set(job.pages.values_list("status", flat=True)) == {Page.Status.CANCELLED}
    assert Document.objects.get(pk=document.pk).status == Document.Status.PENDING  # the split stopped
    assert pool_backlog(sim_pool.pool.pk) == PoolBacklog(waiting=0, running=0)
    assert pool_demand(sim_pool.pool).waiting == 0

    # Another job on the same pool: a dispatcher runs until the pool has nothing left for it.
    other = submit(ordinary_user, {"note.png": image_bytes(["a note"])}, pool_key=sim_pool.pool.key)
    split(other)
    run_dispatch_loop(sim_pool.pool)

    assert other.pages.get().status == Page.Status.DONE
    assert sim_pool.pages_received() == 1  # the other job's page, and none of the cancelled job's
    assert set(job.pages.values_list("status", flat=True)) == {Page.Status.CANCELLED}
