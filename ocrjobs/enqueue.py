"""Sending ocrjobs' tasks (ocrjobs/tasks.py) to their clusters, by dotted name: this module imports
no service and no task body, so a service imports it at module level.
"""

from __future__ import annotations

from django_q.tasks import async_task

from fleetadmin.clusters import DISPATCH, OUTPUTS, SHORT, cluster_name
from pods.models import Pool


def enqueue_split(document_id: int) -> None:
    async_task("ocrjobs.tasks.split_document", document_id, task_name=f"split document {document_id}", group="splits",
               cluster=cluster_name(SHORT))  # fmt: skip


# A split takes milliseconds (it renders nothing), less than a task's own cost in the broker:
# a submission's documents go to tasks this many at a time.
SPLITS_PER_TASK = 20


def enqueue_splits(document_ids: list[int]) -> None:
    """A task a submission (or SPLITS_PER_TASK of its documents). Its success is not kept (``save``
    False; a failure is): one a submission, django-q2's monitor saving each took two statements
    more than the split's own dozen, and the documents say what became of them."""
    for start in range(0, len(document_ids), SPLITS_PER_TASK):
        batch = document_ids[start : start + SPLITS_PER_TASK]
        async_task("ocrjobs.tasks.split_documents", batch, task_name=f"split documents {batch[0]}..{batch[-1]}",
                   group="splits", save=False, cluster=cluster_name(SHORT))  # fmt: skip


def enqueue_dispatch(pool: Pool) -> None:
    """To the dispatch cluster: a loop runs for minutes, and never in a short task's worker."""
    async_task("ocrjobs.tasks.dispatch_pool", pool.pk, task_name=f"dispatch pool {pool.key}", group="dispatch",
               cluster=cluster_name(DISPATCH))  # fmt: skip


def enqueue_fetch(document_id: int) -> None:
    async_task("ocrjobs.tasks.fetch_document", document_id, task_name=f"fetch document {document_id}", group="splits",
               cluster=cluster_name(SHORT))  # fmt: skip


def enqueue_delivery(delivery_id: int, lease: str) -> None:
    """A short task an attempt, WEBHOOK_TIMEOUT_SECONDS at most; WEBHOOK_MAX_IN_FLIGHT at once.
    Sent from a pass: without its cluster named, django-q2 queues a task on the cluster of the
    process that sends it, and the attempt held the passes' one worker (bench/hostile.py: a
    receiver that trickles made a scale request wait 10 s for its pass)."""
    async_task("ocrjobs.tasks.deliver_webhook", delivery_id, lease, task_name=f"webhook delivery {delivery_id}",
               group="webhooks", save=False, cluster=cluster_name(SHORT))  # fmt: skip


# A build is seconds of CPU at most (bench/searchable_pdf.py: 0.6 s a 100 pages), in the outputs'
# cluster (fleetadmin/clusters.py), a few documents a task so that a job of thousands of small
# documents is not as many tasks.
DOCUMENTS_PER_TASK = 20


def enqueue_searchable_pdf_builds(document_ids: list[int]) -> None:
    for start in range(0, len(document_ids), DOCUMENTS_PER_TASK):
        batch = document_ids[start : start + DOCUMENTS_PER_TASK]
        async_task("ocrjobs.output_tasks.build_searchable_pdfs", batch, group="outputs",
                   task_name=f"searchable PDFs {batch[0]}..{batch[-1]}", cluster=cluster_name(OUTPUTS))  # fmt: skip


def enqueue_searchable_pdfs(*, job_ids: list[int]) -> None:
    """Sent once the transaction that ended the jobs commits: the task lists their documents
    (the ending transaction does not read them)."""
    async_task("ocrjobs.output_tasks.request_searchable_pdfs", job_ids, group="outputs", save=False,
               task_name=f"searchable PDFs of jobs {job_ids[0]}..{job_ids[-1]}", cluster=cluster_name(OUTPUTS))  # fmt: skip
