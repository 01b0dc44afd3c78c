"""A searchable PDF whose build was lost is built all the same: its task holds a lease on the row,
renewed as it reads pages; a build whose task the broker lost or whose worker died (kill -9, out of
memory) is sent again by the minute's tick (searchable_pdfs_recover) once its lease lapses, and one
whose worker died PDF_BUILD_ATTEMPTS times fails, saying so, until a rebuild asks again."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from fleetadmin import leases
from ocrjobs.models import Job, SearchablePdf
from ocrjobs.services import recover, searchable_pdf
from ocrjobs.services.outputs import job_outputs_rebuild
from ocrjobs.services.searchable_pdf import searchable_pdf_build
from ocrjobs.storage import document_bytes
from tests.factories import PAGES_TRUTH, pdf_bytes
from tests.ocrjobs.helpers import complete_all, split, submit
from tests.ocrjobs.test_outputs import boxed, text_of


@pytest.fixture
def done_job(ordinary_user, local_pool) -> Job:
    job = submit(ordinary_user, {"report.pdf": pdf_bytes(PAGES_TRUTH[:2])}, searchable_pdf=True)
    split(job)
    complete_all(job, results={(0, 1): boxed(["Water levels rose"]), (0, 2): boxed(["Three pumps serviced"])})
    return job


@pytest.fixture
def sent(monkeypatch) -> list[int]:
    """The documents whose builds the tick sent again (as the broker would get them)."""
    documents: list[int] = []
    monkeypatch.setattr(recover, "enqueue_searchable_pdf_builds", documents.extend)
    return documents


def lapse(row: SearchablePdf) -> None:
    SearchablePdf.objects.filter(pk=row.pk).update(task_lease_until=timezone.now() - timedelta(seconds=1))


def the_pdf(job: Job) -> SearchablePdf:
    return SearchablePdf.objects.get(document__job=job)


def test_a_requested_build_is_queued_with_a_lease(done_job):
    row = the_pdf(done_job)
    assert row.status == SearchablePdf.Status.PENDING and row.task_lease_token == ""
    assert row.task_lease_until > timezone.now()  # the grace within which its task must start
    assert recover.searchable_pdfs_recover() == []  # not before its grace ends


def test_a_build_whose_task_was_lost_is_sent_again_and_built(done_job, sent):
    row = the_pdf(done_job)
    lapse(row)  # the broker lost the task: it never started
    assert recover.searchable_pdfs_recover() == [row.pk] and sent == [row.pk]
    assert the_pdf(done_job).task_lease_until > timezone.now()  # queued again, with a grace of its own
    assert recover.searchable_pdfs_recover() == [] and sent == [row.pk]  # not sent twice at once
    built = searchable_pdf_build(document_id=row.pk)
    assert built.status == SearchablePdf.Status.BUILT
    assert [t.strip() for t in text_of(document_bytes(built.name))] == ["Water levels rose", "Three pumps serviced"]


def test_a_build_whose_worker_died_mid_way_is_built_again(done_job, sent, monkeypatch):
    row = the_pdf(done_job)

    def killed(source, doc, target, lease):
        raise KeyboardInterrupt("kill -9: nothing after this line runs in that worker")

    monkeypatch.setattr(searchable_pdf, "_overlay_pdf", killed)
    with pytest.raises(KeyboardInterrupt):
        searchable_pdf_build(document_id=row.pk)
    monkeypatch.undo()
    died = the_pdf(done_job)
    assert died.status == SearchablePdf.Status.BUILDING and died.attempts == 1
    assert recover.searchable_pdfs_recover() == []  # its lease still runs: the worker may be alive
    lapse(died)
    assert recover.searchable_pdfs_recover() == [row.pk]
    assert searchable_pdf_build(document_id=row.pk).status == SearchablePdf.Status.BUILT


def test_a_second_copy_of_the_task_leaves_the_build_to_the_first(done_job, monkeypatch):
    row = the_pdf(done_job)
    second = []

    def overlay_and_a_second_copy(source, doc, target, lease):
        second.append(searchable_pdf_build(document_id=doc.pk))  # the broker's own retry, at once
        return real(source, doc, target, lease)

    real = searchable_pdf._overlay_pdf
    monkeypatch.setattr(searchable_pdf, "_overlay_pdf", overlay_and_a_second_copy)
    built = searchable_pdf_build(document_id=row.pk)
    assert second[0].status == SearchablePdf.Status.BUILDING  # it left the row as it found it
    assert built.status == SearchablePdf.Status.BUILT and built.builds == 1 and built.attempts == 0


def test_a_build_renews_its_lease_as_it_reads_pages_and_stops_once_taken_over(done_job, settings, monkeypatch):
    settings.TASK_LEASE_SECONDS = 0.0  # renew at every page asked for
    row = the_pdf(done_job)
    seen = []
    real_keep = leases.Hold.keep

    def keep(lease):
        real_keep(lease)
        seen.append(SearchablePdf.objects.get(pk=row.pk).task_lease_until)
        if len(seen) == 1:  # the tick sent it again meanwhile and another worker took the row
            SearchablePdf.objects.filter(pk=row.pk).update(**leases.queued())
            assert leases.acquire(SearchablePdf.objects.filter(pk=row.pk)) is not None

    monkeypatch.setattr(leases.Hold, "keep", keep)
    stopped = searchable_pdf_build(document_id=row.pk)
    assert len(seen) == 1 and seen[0] is not None  # renewed at the first page; then it was not ours
    assert stopped.status == SearchablePdf.Status.BUILDING and stopped.name == ""  # nothing stored: the other stores


def test_a_document_that_kills_its_worker_fails_after_the_attempts_and_a_rebuild_tries_once_more(
    done_job, sent, settings
):
    settings.PDF_BUILD_ATTEMPTS = 2
    row = the_pdf(done_job)
    SearchablePdf.objects.filter(pk=row.pk).update(status=SearchablePdf.Status.BUILDING, attempts=1)
    lapse(row)
    assert recover.searchable_pdfs_recover() == [row.pk]  # one death: sent again
    SearchablePdf.objects.filter(pk=row.pk).update(status=SearchablePdf.Status.BUILDING, attempts=2)
    lapse(row)
    assert recover.searchable_pdfs_recover() == []
    failed = the_pdf(done_job)
    assert failed.status == SearchablePdf.Status.FAILED and "2 times" in failed.error
    assert job_outputs_rebuild(job=done_job, user=done_job.owner) == 1
    again = the_pdf(done_job)
    # The deaths stay counted (a rebuild once reset them: a hostile document could kill a worker
    # PDF_BUILD_ATTEMPTS times a rebuild, issue 38 N2): the next death fails it at once.
    assert again.status == SearchablePdf.Status.PENDING and again.attempts == 2 and again.task_lease_token == ""
    SearchablePdf.objects.filter(pk=row.pk).update(status=SearchablePdf.Status.BUILDING, attempts=3)
    lapse(row)
    assert recover.searchable_pdfs_recover() == [] and the_pdf(done_job).status == SearchablePdf.Status.FAILED
    assert job_outputs_rebuild(job=done_job, user=done_job.owner) == 1
    built = searchable_pdf_build(document_id=row.pk)  # this time it ends: the count starts again
    assert built.status == SearchablePdf.Status.BUILT and built.attempts == 0


def test_the_minutes_tick_recovers_lost_builds(done_job, sent):
    from pods.tasks import scaler_tick

    lapse(the_pdf(done_job))
    scaler_tick()
    assert sent == [the_pdf(done_job).pk]
