"""django-q2 tasks that build a finished job's outputs (issue 25), each with its enqueue helper
beside it. A module of their own: the services send them from the transaction that ends a job
(ocrjobs/services/outputs.py imports this module inside the function that sends)."""

from __future__ import annotations

from django_q.tasks import async_task

from fleetadmin.clusters import SHORT, cluster_name
from fleetadmin.db import retry_on_db_error
from ocrjobs.services.outputs import searchable_pdfs_pending
from ocrjobs.services.searchable_pdf import searchable_pdf_build

# A build is seconds of CPU at most (0.6 s a 100 pages on this machine): short work, a few
# documents a task so that a job of thousands of small documents is not as many tasks.
DOCUMENTS_PER_TASK = 20


@retry_on_db_error
def build_searchable_pdfs(document_ids: list[int]) -> str:
    rows = [searchable_pdf_build(document_id=document_id) for document_id in document_ids]
    built = sum(1 for row in rows if row is not None and row.status == row.Status.BUILT)
    return f"{len(document_ids)} documents: {built} searchable PDFs built"


def enqueue_searchable_pdf_builds(document_ids: list[int]) -> None:
    for start in range(0, len(document_ids), DOCUMENTS_PER_TASK):
        batch = document_ids[start : start + DOCUMENTS_PER_TASK]
        async_task("ocrjobs.output_tasks.build_searchable_pdfs", batch, group="outputs",
                   task_name=f"searchable PDFs {batch[0]}..{batch[-1]}", cluster=cluster_name(SHORT))  # fmt: skip


@retry_on_db_error
def request_searchable_pdfs(job_ids: list[int]) -> str:
    """The jobs' pending documents, DOCUMENTS_PER_TASK to a task of their own."""
    document_ids = [pk for job_id in job_ids for pk in searchable_pdfs_pending(job_id=job_id)]
    enqueue_searchable_pdf_builds(document_ids)
    return f"{len(job_ids)} jobs: {len(document_ids)} searchable PDFs to build"


def enqueue_searchable_pdfs(*, job_ids: list[int]) -> None:
    """Sent once the transaction that ended the jobs commits: the task lists their documents
    (the ending transaction does not read them)."""
    async_task("ocrjobs.output_tasks.request_searchable_pdfs", job_ids, group="outputs", save=False,
               task_name=f"searchable PDFs of jobs {job_ids[0]}..{job_ids[-1]}", cluster=cluster_name(SHORT))  # fmt: skip
