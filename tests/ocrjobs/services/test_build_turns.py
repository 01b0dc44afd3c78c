"""Searchable PDF builds taken in turn by owner (issue 38): a build task builds the next waiting
document in turn, not its own batch in the order asked, so one user's storm of rebuilds leaves
another user's build waiting one build, not twenty; one owner holds PDF_BUILDS_PER_OWNER at most."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from ocrjobs.models import SearchablePdf
from ocrjobs.output_tasks import build_searchable_pdfs
from ocrjobs.services import build_turns, searchable_pdf
from ocrjobs.services.outputs import job_outputs_rebuild
from tests.factories import pdf_bytes
from tests.ocrjobs.helpers import complete_all, split, submit

pytestmark = pytest.mark.usefixtures("local_pool")


def done_job(owner, documents: int = 1):
    job = submit(owner, {f"d{n}.pdf": pdf_bytes([[f"page {n}"]]) for n in range(documents)}, searchable_pdf=True)
    split(job)
    complete_all(job)
    return job


@pytest.fixture
def built(monkeypatch) -> list[int]:
    """The owners of the documents built, in the order they were built."""
    order: list[int] = []
    build = searchable_pdf.searchable_pdf_build

    def watched(*, document_id):
        row = build(document_id=document_id)
        order.append(row.document.job.owner_id)
        return row

    monkeypatch.setattr(build_turns, "searchable_pdf_build", watched)
    return order


def test_one_task_builds_the_waiting_documents_in_turn_by_owner(ordinary_user, outsider, built):
    storm = done_job(ordinary_user, documents=3)  # asked first
    theirs = done_job(outsider)

    build_searchable_pdfs(list(storm.documents.values_list("pk", flat=True)))  # the storm's task, run first

    bob, mallory = ordinary_user.pk, outsider.pk
    assert built == [bob, mallory, bob, bob]  # the other owner's one waits one build, not three
    assert SearchablePdf.objects.get(document__job=theirs).status == SearchablePdf.Status.BUILT
    assert build_searchable_pdfs([theirs.documents.get().pk]).startswith("sent for 1 documents: 0")  # done already


def test_rebuilds_go_behind_the_turn_of_an_owner_not_served_since(ordinary_user, outsider, built, settings):
    settings.OUTPUT_REBUILDS_PER_HOUR = 100
    storm = done_job(ordinary_user)
    build_searchable_pdfs([])
    for _ in range(5):
        job_outputs_rebuild(job=storm, user=ordinary_user)  # one document: the same row, again
    theirs = done_job(outsider)
    built.clear()

    build_searchable_pdfs([])

    assert built == [outsider.pk, ordinary_user.pk]  # the storm's rebuilds are one build, after theirs
    assert SearchablePdf.objects.get(document__job=theirs).status == SearchablePdf.Status.BUILT


def test_an_owner_at_their_cap_waits_and_another_owners_build_goes(ordinary_user, outsider, settings):
    settings.PDF_BUILDS_PER_OWNER = 1
    storm = done_job(ordinary_user, documents=2)
    first, second = storm.documents.order_by("position")
    SearchablePdf.objects.filter(pk=first.pk).update(status=SearchablePdf.Status.BUILDING, task_lease_token="live",
                                                     task_lease_until=timezone.now() + timedelta(minutes=1))  # fmt: skip
    assert build_turns.build_next(tried=set()) is None  # the owner's one build is running
    theirs = done_job(outsider)
    assert build_turns.build_next(tried=set()) == theirs.documents.get().pk
    settings.PDF_BUILDS_PER_OWNER = 2
    assert build_turns.build_next(tried={theirs.documents.get().pk}) == second.pk


def test_a_task_past_its_time_sends_one_more_for_the_rest(ordinary_user, queued):
    from fleetadmin.clusters import OUTPUTS

    done_job(ordinary_user, documents=2)

    taken = build_turns.searchable_pdfs_build_in_turn(seconds=0)

    assert len(taken) == 1
    assert queued(OUTPUTS).count("ocrjobs.output_tasks.build_searchable_pdfs") == 1
