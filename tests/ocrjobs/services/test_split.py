"""ocrjobs.services.split: a split renders nothing, makes each page once, one task for many documents,
and leaves alone what it does not hold."""

from __future__ import annotations

import hashlib
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from ocrjobs.models import Document, Job, Page
from ocrjobs.services import split as split_services
from ocrjobs.services.dispatchers import dispatcher_register
from ocrjobs.services.jobs import job_cancel
from ocrjobs.services.split import document_split
from tests.factories import PAGES_TRUTH, image_bytes, pdf_bytes
from tests.ocrjobs.helpers import complete_all, files_under, reload, submit, tiff_bytes

pytestmark = pytest.mark.usefixtures("local_pool")


def test_split_renders_nothing_a_page_is_its_document_and_number(ordinary_user, media_root):
    job = submit(ordinary_user, {"report.pdf": pdf_bytes(PAGES_TRUTH, dpi=200)})

    document = document_split(document_id=job.documents.get().pk)

    assert document.status == Document.Status.SPLIT
    pages = list(document.pages.order_by("number"))
    assert [p.number for p in pages] == [1, 2, 3]
    for page in pages:
        assert page.status == Page.Status.PENDING
        assert page.pool_id == job.pool_id
        assert page.document_id == document.pk
    # The source is the only file: no page was rendered to an image.
    assert files_under(media_root) == [document.source_path]
    assert reload(job).status == Job.Status.RUNNING


@pytest.mark.parametrize(("name", "fmt"), [("scan.png", "PNG"), ("photo.jpg", "JPEG")])
def test_split_takes_a_png_or_jpeg_as_one_page_of_its_own_bytes(ordinary_user, media_root, name, fmt):
    content = image_bytes(["one line"], fmt)
    job = submit(ordinary_user, {name: content})

    document = document_split(document_id=job.documents.get().pk)

    page = document.pages.get()
    assert page.number == 1
    assert document.sha256 == hashlib.sha256(content).hexdigest()
    assert [p.name for p in files_under(media_root)] == [f"source{document.source_path.suffix}"]


def test_split_makes_one_page_per_tiff_frame(ordinary_user, media_root):
    sizes = [(120, 80), (90, 60), (50, 40)]
    job = submit(ordinary_user, {"scan.tif": tiff_bytes(sizes)})
    assert job.documents.get().page_count == 3

    document = document_split(document_id=job.documents.get().pk)

    assert [p.number for p in document.pages.order_by("number")] == [1, 2, 3]
    assert [p.name for p in files_under(media_root)] == ["source.tif"]


def test_split_leaves_a_page_over_the_pixel_limit_to_the_pod_to_fit(ordinary_user, settings):
    job = submit(ordinary_user, {"report.pdf": pdf_bytes(PAGES_TRUTH[:1], dpi=200)})
    # A limit lowered after submission: the page is still made; the pod renders it at the largest
    # DPI under its limit, with a warning (issue 40), rather than the document failing.
    settings.OCR_MAX_IMAGE_PIXELS = 1000

    document = document_split(document_id=job.documents.get().pk)

    assert document.status == Document.Status.SPLIT
    assert document.pages.count() == 1


def test_documents_split_together_refresh_their_job_and_tell_the_scaler_once(ordinary_user, queued):
    job = submit(ordinary_user, {"a.pdf": pdf_bytes(PAGES_TRUTH[:2]), "b.png": image_bytes(["b"]),
                                 "c.jpg": image_bytes(["c"], "JPEG")})  # fmt: skip
    queued_before = len(queued())

    documents = split_services.documents_split(document_ids=list(job.documents.values_list("pk", flat=True)))

    assert [d.status for d in documents] == [Document.Status.SPLIT] * 3
    assert job.pages.count() == 4
    assert reload(job).status == Job.Status.RUNNING
    assert queued()[queued_before:] == ["pods.tasks.scaler_tick"]  # no dispatcher is live: one tick, not three


def test_documents_split_together_take_a_few_statements_for_them_all(ordinary_user):
    files = {f"p{n}.png": image_bytes([f"page {n}"]) for n in range(10)} | {"a.pdf": pdf_bytes(PAGES_TRUTH[:2])}
    jobs = [submit(ordinary_user, files), submit(ordinary_user, files)]
    ids = list(Document.objects.filter(job__in=jobs).values_list("pk", flat=True))

    with CaptureQueriesContext(connection) as statements:
        documents = split_services.documents_split(document_ids=ids)

    assert [d.status for d in documents] == [Document.Status.SPLIT] * 22
    assert Page.objects.filter(job__in=jobs, status=Page.Status.PENDING).count() == 24
    assert {reload(job).status for job in jobs} == {Job.Status.RUNNING}
    # ~11 statements a document once (and a job refresh each): 22 documents took 240.
    assert len(statements) <= 15, [q["sql"][:80] for q in statements]


def test_documents_split_together_run_again_make_only_the_missing_pages(ordinary_user):
    job = submit(ordinary_user, {"report.pdf": pdf_bytes(), "a.png": image_bytes(["a"])})
    ids = list(job.documents.values_list("pk", flat=True))
    split_services.documents_split(document_ids=ids)
    before = dict(job.pages.values_list("pk", "status"))
    kept = job.pages.filter(number=1).first()
    Page.objects.filter(pk=kept.pk).update(status=Page.Status.DONE, result='{"text": "read"}')
    job.pages.filter(number=3).delete()  # as after a crash: a page missing, the documents pending
    Document.objects.filter(pk__in=ids).update(status=Document.Status.PENDING)

    split_services.documents_split(document_ids=ids)

    after = dict(job.pages.values_list("pk", "status"))
    assert len(after) == len(before) and reload(kept).result == '{"text": "read"}'  # kept as it was
    assert sorted(job.pages.values_list("number", flat=True)) == [1, 1, 2, 3]
    assert set(job.documents.values_list("status", flat=True)) == {Document.Status.SPLIT}


def test_documents_split_together_leave_the_documents_another_task_holds(ordinary_user):
    job = submit(ordinary_user, {"a.png": image_bytes(["a"]), "b.png": image_bytes(["b"])})
    first, second = job.documents.order_by("position")
    Document.objects.filter(pk=second.pk).update(
        task_lease_token="other", task_lease_until=timezone.now() + timedelta(minutes=1)
    )

    split_services.documents_split(document_ids=[first.pk, second.pk])

    assert reload(first).status == Document.Status.SPLIT and reload(second).status == Document.Status.PENDING
    assert reload(second).task_lease_token == "other" and list(job.pages.values_list("document_id", flat=True)) == [
        first.pk
    ]


def test_documents_split_together_save_none_whose_lease_was_taken_over_meanwhile(ordinary_user, monkeypatch):
    job = submit(ordinary_user, {"a.png": image_bytes(["a"]), "b.png": image_bytes(["b"]), "c.png": image_bytes(["c"])})
    first, second, third = job.documents.order_by("position")
    count_and_make = split_services._count_and_make

    def lease_lapses_and_another_task_takes_it(document, existing, token):
        made = count_and_make(document, existing, token)
        if document.pk == second.pk:
            Document.objects.filter(pk=second.pk).update(task_lease_token="other")
        return made

    monkeypatch.setattr(split_services, "_count_and_make", lease_lapses_and_another_task_takes_it)

    split_services.documents_split(document_ids=[first.pk, second.pk, third.pk])

    assert [reload(d).status for d in (first, second, third)] == ["split", "pending", "split"]
    assert sorted(job.pages.values_list("document_id", flat=True)) == [first.pk, third.pk]
    assert reload(second).task_lease_token == "other"  # its pages are the other task's to make


def test_documents_split_together_skip_a_cancelled_job_and_release_its_documents(ordinary_user):
    cancelled = submit(ordinary_user, {"a.png": image_bytes(["a"])})
    running = submit(ordinary_user, {"b.png": image_bytes(["b"])})
    job_cancel(job=cancelled)
    ids = [cancelled.documents.get().pk, running.documents.get().pk]

    split_services.documents_split(document_ids=ids)

    left = cancelled.documents.get()
    assert left.status == Document.Status.PENDING and left.task_lease_until <= timezone.now()
    assert cancelled.pages.count() == 0 and running.pages.count() == 1


def test_documents_split_together_split_a_long_document_batch_by_batch(ordinary_user, monkeypatch):
    monkeypatch.setattr(split_services, "SPLIT_BATCH", 2)
    saved = []
    save_pages = split_services._save_pages
    monkeypatch.setattr(split_services, "_save_pages",
                        lambda document, pages, **kw: saved.append(len(pages)) or save_pages(document, pages, **kw))  # fmt: skip
    job = submit(ordinary_user, {"long.pdf": pdf_bytes(PAGES_TRUTH), "a.png": image_bytes(["a"])})

    documents = split_services.documents_split(document_ids=list(job.documents.values_list("pk", flat=True)))

    assert [d.status for d in documents] == [Document.Status.SPLIT] * 2
    assert saved == [2, 1]  # the long one's batches: its first pages claimable before the rest are made
    assert job.pages.count() == 4


def test_new_pages_nudge_no_scaler_while_a_dispatcher_of_the_pool_is_live(ordinary_user, queued):
    job = submit(ordinary_user, {"a.png": image_bytes(["a"])})
    dispatcher_register(pool_id=job.pool_id)
    queued_before = len(queued())

    document_split(document_id=job.documents.get().pk)

    assert job.pages.count() == 1
    assert queued()[queued_before:] == []  # the live dispatcher claims them


def test_split_run_again_makes_only_the_missing_pages(ordinary_user):
    job = submit(ordinary_user, {"report.pdf": pdf_bytes()})
    document = document_split(document_id=job.documents.get().pk)
    first_ids = dict(document.pages.values_list("number", "pk"))
    # As after a crash between two batches.
    document.pages.filter(number=3).delete()
    Document.objects.filter(pk=document.pk).update(status=Document.Status.PENDING)

    document_split(document_id=document.pk)

    again = dict(document.pages.values_list("number", "pk"))
    assert sorted(again) == [1, 2, 3]
    assert again[1] == first_ids[1] and again[2] == first_ids[2]


def test_split_of_a_split_document_makes_nothing_more(ordinary_user):
    job = submit(ordinary_user, {"report.pdf": pdf_bytes()})
    document_id = job.documents.get().pk
    document_split(document_id=document_id)

    document_split(document_id=document_id)

    assert Page.objects.count() == 3


def test_split_of_a_cancelled_job_makes_no_pages(ordinary_user):
    job = submit(ordinary_user, {"report.pdf": pdf_bytes()})
    job_cancel(job=job)

    document_split(document_id=job.documents.get().pk)

    assert Page.objects.count() == 0


def test_a_job_cancelled_mid_split_stops_its_split_at_the_next_batch_boundary(ordinary_user, monkeypatch):
    monkeypatch.setattr(split_services, "SPLIT_BATCH", 2)
    job = submit(ordinary_user, {"report.pdf": pdf_bytes(PAGES_TRUTH * 3)})  # 9 pages: 5 batches
    saved = []
    save_pages = split_services._save_pages

    def cancelling_save(document, pages):
        saved.append([p.number for p in pages])
        if len(saved) == 2:  # as the second batch is made
            job_cancel(job=job)
        return save_pages(document, pages)

    monkeypatch.setattr(split_services, "_save_pages", cancelling_save)

    document = document_split(document_id=job.documents.get().pk)

    assert saved == [[1, 2], [3, 4]]  # the batch under way is not saved; nothing after it is made
    assert dict(job.pages.values_list("number", "status")) == {1: Page.Status.CANCELLED, 2: Page.Status.CANCELLED}
    assert reload(document).status == Document.Status.PENDING
    assert reload(job).status == Job.Status.CANCELLED


def test_a_document_unreadable_at_split_time_fails_with_its_error_and_the_job_fails(ordinary_user):
    job = submit(ordinary_user, {"report.pdf": pdf_bytes(PAGES_TRUTH[:1])})
    document = job.documents.get()
    document.source_path.write_bytes(b"%PDF-1.4 truncated on disk")

    document = document_split(document_id=document.pk)

    assert document.status == Document.Status.FAILED
    assert "cannot be read" in document.error
    assert document.pages.count() == 0
    assert reload(job).status == Job.Status.FAILED


def test_a_job_waits_for_every_document_to_be_split_before_it_ends(ordinary_user):
    job = submit(ordinary_user, {"a.png": image_bytes(["a"]), "b.png": image_bytes(["b"])})
    first, second = job.documents.order_by("position")
    document_split(document_id=first.pk)
    complete_all(job)

    assert reload(job).status == Job.Status.RUNNING

    document_split(document_id=second.pk)
    complete_all(job)

    assert reload(job).status == Job.Status.DONE
