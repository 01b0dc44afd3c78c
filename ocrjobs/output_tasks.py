"""django-q2 tasks that build a finished job's outputs (issue 25); ocrjobs/enqueue.py sends them."""

from __future__ import annotations

from fleetadmin.db import retry_on_db_error
from ocrjobs.enqueue import enqueue_searchable_pdf_builds
from ocrjobs.services.build_turns import searchable_pdfs_build_in_turn
from ocrjobs.services.outputs import searchable_pdfs_pending


@retry_on_db_error
def build_searchable_pdfs(document_ids: list[int]) -> str:
    """Sent for ``document_ids``; builds whichever wait, in turn by owner (services/build_turns.py)."""
    built = searchable_pdfs_build_in_turn()
    return f"sent for {len(document_ids)} documents: {len(built)} searchable PDFs built in turn"


@retry_on_db_error
def request_searchable_pdfs(job_ids: list[int]) -> str:
    """The jobs' pending documents, enqueue.DOCUMENTS_PER_TASK to a task."""
    document_ids = [pk for job_id in job_ids for pk in searchable_pdfs_pending(job_id=job_id)]
    enqueue_searchable_pdf_builds(document_ids)
    return f"{len(job_ids)} jobs: {len(document_ids)} searchable PDFs to build"
