"""ocrjobs.services: splitting documents, the life of a page, and how a job ends."""

from __future__ import annotations

import hashlib
import io
import re
from datetime import timedelta

import pytest
from django.conf import settings
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from fleetadmin.api import ApiError
from ocrjobs.models import Document, Job, Page
from ocrjobs.selectors import PoolBacklog, pages_waiting, pool_backlog
from ocrjobs.services import pages as page_services
from ocrjobs.services import split as split_services
from ocrjobs.services.dispatchers import dispatcher_register
from ocrjobs.services.jobs import job_cancel, job_refresh, job_retry_failed, jobs_refresh
from ocrjobs.services.pages import (
    PageResult,
    claims_renew,
    page_attempt_failed,
    page_complete,
    pages_assign_pods,
    pages_claim,
    pages_complete,
    pages_requeue_from_pod,
    pages_unclaim,
)
from ocrjobs.services.split import document_split
from ocrjobs.services.submission import Upload, job_submit
from pods.models import Pod
from pods.services.scaler import pool_demand
from tests.factories import PAGES_TRUTH, image_bytes, pdf_bytes
from tests.ocrjobs.helpers import complete_all, files_under, result_for, split, submit, tiff_bytes

pytestmark = pytest.mark.usefixtures("local_pool")


def expire_claims(*pages: Page) -> None:
    """As if the dispatcher holding them had stopped renewing a while ago."""
    Page.objects.filter(pk__in=[p.pk for p in pages]).update(claim_expires_at=timezone.now() - timedelta(seconds=5))


def results_of(page: Page) -> list[str]:
    """The texts stored for the page: in its row (no result file is written anywhere)."""
    media = settings.MEDIA_ROOT
    written = [path for path in files_under(media) if path.parent.name == "results" or path.suffix == ".json"]
    assert written == [], f"result files on disk: {written}"
    page = Page.objects.get(pk=page.pk)
    return [page.read_result()["text"]] if page.result else []


@pytest.fixture
def one_page_job(ordinary_user) -> Job:
    job = submit(ordinary_user, {"note.png": image_bytes(["a note"])})
    split(job)
    return job


@pytest.fixture
def page(one_page_job) -> Page:
    return one_page_job.pages.get()


def reload(obj):
    obj.refresh_from_db()
    return obj


# --- submitting ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sent", "stored"),
    [
        ("../../etc/passwd.pdf", "passwd.pdf"),
        ("..\\..\\x.pdf", "x.pdf"),
        ("..", "document"),
        ("/abs/path/.hidden.pdf", "hidden.pdf"),
        ("bell\x07and\nnewline.pdf", "bellandnewline.pdf"),
    ],
)
def test_submit_keeps_only_a_clean_file_name_and_stores_the_file_under_a_name_of_its_own(
    ordinary_user, media_root, tmp_path, sent, stored
):
    job = submit(ordinary_user, {sent: pdf_bytes(PAGES_TRUTH[:1])})

    document = job.documents.get()
    assert document.name == stored
    assert re.fullmatch(r"documents/[0-9a-f]{32}/source\.pdf", document.source), document.source
    assert files_under(tmp_path) == [media_root / document.source]


def test_submit_checks_every_file_before_storing_any(ordinary_user, media_root):
    with pytest.raises(ApiError) as refused:
        submit(ordinary_user, {"good.pdf": pdf_bytes(PAGES_TRUTH[:1]), "bad.pdf": b"%PDF-1.4 nonsense"})

    assert refused.value.status == 400
    assert "bad.pdf" in refused.value.message
    assert Job.objects.count() == 0
    assert files_under(media_root) == []


def test_submit_without_a_pool_uses_the_first_pool(ordinary_user, local_pool):
    job = job_submit(owner=ordinary_user, uploads=[Upload(name="a.png", file=io.BytesIO(image_bytes(["a"])))])

    assert job.pool == local_pool
    assert job.languages == "eng"


# --- splitting ------------------------------------------------------------------------------


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


def test_submission_hashes_the_document_as_its_bytes_arrive(ordinary_user):
    content = pdf_bytes(PAGES_TRUTH[:1])
    job = submit(ordinary_user, {"report.pdf": content})

    document = job.documents.get()
    assert document.sha256 == hashlib.sha256(content).hexdigest()
    assert document.source_path.read_bytes() == content


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


def test_split_checks_the_pixel_limit_from_the_page_size_without_rendering(ordinary_user, settings):
    job = submit(ordinary_user, {"report.pdf": pdf_bytes(PAGES_TRUTH[:1], dpi=200)})
    # A limit lowered after submission: the split checks again, and fails the document.
    settings.OCR_MAX_IMAGE_PIXELS = 1000

    document = document_split(document_id=job.documents.get().pk)

    assert document.status == Document.Status.FAILED
    assert "over the limit of 1000 pixels" in document.error
    assert document.pages.count() == 0


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


def test_jobs_refresh_refreshes_only_the_jobs_with_no_page_waiting_or_out(ordinary_user):
    busy = [submit(ordinary_user, {"a.png": image_bytes(["a"]), "b.png": image_bytes(["b"])}) for _ in range(5)]
    ended = submit(ordinary_user, {"c.png": image_bytes(["c"])})
    for job in [*busy, ended]:
        split(job)
    Page.objects.filter(job=busy[0]).update(status=Page.Status.RUNNING)  # out at a pod
    for job in busy[1:]:
        Page.objects.filter(pk=job.pages.first().pk).update(status=Page.Status.DONE)  # one done, one waiting
    Page.objects.filter(job=ended).update(status=Page.Status.DONE)  # stored, the job not refreshed yet

    with CaptureQueriesContext(connection) as statements:
        refreshed = jobs_refresh(job_ids=[job.pk for job in busy])

    assert refreshed == [] and len(statements) == 1  # one look at five jobs that still have pages to go
    assert {reload(job).status for job in busy} == {Job.Status.RUNNING}
    assert jobs_refresh(job_ids=[ended.pk, *[job.pk for job in busy]]) == [ended.pk]
    assert reload(ended).status == Job.Status.DONE


def test_a_job_waits_for_every_document_to_be_split_before_it_ends(ordinary_user):
    job = submit(ordinary_user, {"a.png": image_bytes(["a"]), "b.png": image_bytes(["b"])})
    first, second = job.documents.order_by("position")
    document_split(document_id=first.pk)
    complete_all(job)

    assert reload(job).status == Job.Status.RUNNING

    document_split(document_id=second.pk)
    complete_all(job)

    assert reload(job).status == Job.Status.DONE


# --- claim, complete ---------------------------------------------------------------------------


def test_claim_then_complete_finishes_the_job(one_page_job, page, media_root):
    claimed = pages_claim(pool_id=page.pool_id, token="A", limit=10)

    document = page.document
    assert [(c.id, c.job_id, c.document_id, c.source, c.sha256, c.number, c.languages, c.attempts)
            for c in claimed] == [
        (page.pk, one_page_job.pk, document.pk, document.source, document.sha256, 1, "eng", 1)
    ]  # fmt: skip
    page = reload(page)
    assert page.status == Page.Status.RUNNING
    assert page.claim_token == "A"
    assert page.claim_expires_at > timezone.now()

    assert page_complete(page_id=page.pk, token="A", pod_id=None, result=result_for("a note")) is True
    job = job_refresh(job_id=one_page_job.pk)

    page = reload(page)
    assert page.status == Page.Status.DONE
    assert page.read_result()["text"] == "a note\n"
    assert page.confidence == pytest.approx(91.5)
    assert (page.claim_token, page.claim_expires_at) == ("", None)
    assert results_of(page) == ["a note\n"]
    assert job.status == Job.Status.DONE
    assert job.finished_at is not None


def test_a_page_whose_claim_expired_on_its_last_attempt_is_never_claimed_again(one_page_job, page):
    # Review L9: it waited again until a sweep failed it, so a claim without a sweep ran it once more.
    Page.objects.filter(pk=page.pk).update(status=Page.Status.RUNNING, attempts=settings.PAGE_MAX_ATTEMPTS,
                                           claim_token="gone", claim_expires_at=timezone.now() - timedelta(seconds=1))  # fmt: skip

    assert pages_claim(pool_id=page.pool_id, token="A", limit=10, sweep=False) == []
    assert pages_waiting(pool_id=page.pool_id) == 1  # still counted: a dispatcher comes and sweeps it
    assert pages_claim(pool_id=page.pool_id, token="A", limit=10) == []

    page = reload(page)
    assert (page.status, page.attempts) == (Page.Status.FAILED, settings.PAGE_MAX_ATTEMPTS)
    assert "attempts" in page.error


def test_claims_take_at_most_the_limit_and_never_the_same_page_twice(ordinary_user):
    job = submit(ordinary_user, {"report.pdf": pdf_bytes()})
    split(job)

    first = pages_claim(pool_id=job.pool_id, token="A", limit=2)
    second = pages_claim(pool_id=job.pool_id, token="B", limit=2)
    third = pages_claim(pool_id=job.pool_id, token="C", limit=2)

    assert len(first) == 2 and len(second) == 1 and third == []
    assert {c.id for c in first} | {c.id for c in second} == set(job.pages.values_list("pk", flat=True))


def test_complete_twice_with_the_same_token_stores_the_result_once(page):
    pages_claim(pool_id=page.pool_id, token="A", limit=1)
    assert page_complete(page_id=page.pk, token="A", pod_id=None, result=result_for("first")) is True

    again = page_complete(page_id=page.pk, token="A", pod_id=None, result=result_for("second"))

    assert again is False
    assert reload(page).read_result()["text"] == "first\n"
    assert results_of(page) == ["first\n"]


def test_two_results_for_one_page_in_one_batch_store_the_first(page):
    claim = pages_claim(pool_id=page.pool_id, token="A", limit=1)[0]
    first, second = (
        PageResult(page.pk, claim.job_id, claim.position, None, result_for(text), attempt=claim.attempts)
        for text in ("first", "second")
    )

    assert pages_complete(token="A", items=[first, second]) == {page.pk}

    page = reload(page)
    assert page.read_result()["text"] == "first\n"
    assert results_of(page) == ["first\n"]


def test_a_batch_stored_again_after_a_lost_answer_keeps_its_one_result(page):
    # The database committed the batch but the connection dropped before the answer came back:
    # the dispatcher stores the same batch again on a fresh connection.
    claim = pages_claim(pool_id=page.pool_id, token="A", limit=1)[0]
    item = PageResult(page.pk, claim.job_id, claim.position, None, result_for("once"), attempt=claim.attempts)
    assert pages_complete(token="A", items=[item]) == {page.pk}

    assert pages_complete(token="A", items=[item]) == set()

    page = reload(page)
    assert page.read_result()["text"] == "once\n"
    assert results_of(page) == ["once\n"]


def test_a_batch_stored_again_after_a_failed_try_stores_it_once(page, monkeypatch):
    from django.db import OperationalError

    claim = pages_claim(pool_id=page.pool_id, token="A", limit=1)[0]
    item = PageResult(page.pk, claim.job_id, claim.position, None, result_for("once"), attempt=claim.attempts)

    def connection_dropped(result):
        raise OperationalError("server closed the connection unexpectedly")

    with monkeypatch.context() as patched:  # the database fails mid-store
        patched.setattr(page_services, "_confidence", connection_dropped)
        with pytest.raises(OperationalError):
            pages_complete(token="A", items=[item])
    assert pages_complete(token="A", items=[item]) == {page.pk}  # tried again, as the dispatcher does

    page = reload(page)
    assert results_of(page) == ["once\n"]


def test_a_result_of_a_superseded_attempt_with_the_same_token_is_refused(page, local_pool):
    pod = Pod.objects.create(pool=local_pool, name="fa-local-gone")
    old = pages_claim(pool_id=page.pool_id, token="A", limit=1)[0]
    pages_assign_pods(token="A", assignments=[(page.pk, old.attempts, pod.pk)])
    pages_requeue_from_pod(pod_id=pod.pk)  # the pod was lost; the same dispatcher claims it again
    new = pages_claim(pool_id=page.pool_id, token="A", limit=1)[0]
    assert (old.attempts, new.attempts) == (1, 2)

    late = PageResult(page.pk, old.job_id, old.position, pod.pk, result_for("late"), attempt=old.attempts)
    assert pages_complete(token="A", items=[late]) == set()
    pages_assign_pods(token="A", assignments=[(page.pk, old.attempts, pod.pk)])
    assert page_attempt_failed(page_id=page.pk, token="A", pod_id=pod.pk, error="x",
                               attempt=old.attempts) == "lost"  # fmt: skip

    page = reload(page)
    assert (page.status, page.attempts, page.pod_id, page.error) == (Page.Status.RUNNING, 2, None, "")
    assert results_of(page) == []
    fresh = PageResult(page.pk, new.job_id, new.position, None, result_for("fresh"), attempt=new.attempts)
    assert pages_complete(token="A", items=[fresh]) == {page.pk}
    assert reload(page).read_result()["text"] == "fresh\n"


def test_complete_with_a_token_that_never_claimed_the_page_is_refused(page):
    pages_claim(pool_id=page.pool_id, token="A", limit=1)

    assert page_complete(page_id=page.pk, token="B", pod_id=None, result=result_for("x")) is False

    assert reload(page).status == Page.Status.RUNNING
    assert results_of(page) == []


def test_an_expired_claim_goes_to_another_token_and_the_first_result_is_refused(page):
    pages_claim(pool_id=page.pool_id, token="A", limit=1)
    expire_claims(page)

    reclaimed = pages_claim(pool_id=page.pool_id, token="B", limit=1)
    late = page_complete(page_id=page.pk, token="A", pod_id=None, result=result_for("from A"))
    stored = page_complete(page_id=page.pk, token="B", pod_id=None, result=result_for("from B"))

    assert [(c.id, c.attempts) for c in reclaimed] == [(page.pk, 2)]
    assert late is False
    assert stored is True
    page = reload(page)
    assert results_of(page) == ["from B\n"]


def test_the_first_tokens_late_result_after_the_second_finished_is_refused(page):
    pages_claim(pool_id=page.pool_id, token="A", limit=1)
    expire_claims(page)
    pages_claim(pool_id=page.pool_id, token="B", limit=1)
    assert page_complete(page_id=page.pk, token="B", pod_id=None, result=result_for("from B"))

    late = page_complete(page_id=page.pk, token="A", pod_id=None, result=result_for("from A"))

    assert late is False
    assert results_of(page) == ["from B\n"]


def test_a_page_whose_claim_has_not_expired_is_not_claimed_again(page):
    pages_claim(pool_id=page.pool_id, token="A", limit=1)

    assert pages_claim(pool_id=page.pool_id, token="B", limit=1) == []
    assert reload(page).claim_token == "A"


def test_unclaim_gives_the_page_back_without_spending_an_attempt(page):
    pages_claim(pool_id=page.pool_id, token="A", limit=1)

    assert pages_unclaim(token="A", page_ids=[page.pk]) == 1

    page = reload(page)
    assert (page.status, page.attempts, page.claim_token, page.claim_expires_at) == (Page.Status.PENDING, 0, "", None)
    assert [c.attempts for c in pages_claim(pool_id=page.pool_id, token="B", limit=1)] == [1]


def test_unclaim_with_another_token_changes_nothing(page):
    pages_claim(pool_id=page.pool_id, token="A", limit=1)

    assert pages_unclaim(token="B", page_ids=[page.pk]) == 0

    page = reload(page)
    assert (page.status, page.attempts, page.claim_token) == (Page.Status.RUNNING, 1, "A")


def test_renewing_a_claim_pushes_its_expiry_later(page, settings):
    settings.PAGE_CLAIM_SECONDS = 60
    pages_claim(pool_id=page.pool_id, token="A", limit=1)
    soon = timezone.now() + timedelta(seconds=1)
    Page.objects.filter(pk=page.pk).update(claim_expires_at=soon)

    assert claims_renew(token="A", page_ids=[page.pk]) == {page.pk}

    assert reload(page).claim_expires_at > soon + timedelta(seconds=30)


def test_renewing_with_another_token_leaves_the_claim_alone(page):
    pages_claim(pool_id=page.pool_id, token="A", limit=1)
    soon = timezone.now() + timedelta(seconds=1)
    Page.objects.filter(pk=page.pk).update(claim_expires_at=soon)

    assert claims_renew(token="B", page_ids=[page.pk]) == set()

    assert reload(page).claim_expires_at == soon


def test_pages_of_a_lost_pod_wait_again_with_their_attempt_counted(page, local_pool):
    pod = Pod.objects.create(pool=local_pool, name="fa-local-lost")
    pages_claim(pool_id=page.pool_id, token="A", limit=1)
    pages_assign_pods(token="A", assignments=[(page.pk, 1, pod.pk)])

    assert pages_requeue_from_pod(pod_id=pod.pk) == 1

    page = reload(page)
    assert (page.status, page.attempts, page.claim_token) == (Page.Status.PENDING, 1, "")
    assert page_complete(page_id=page.pk, token="A", pod_id=pod.pk, result=result_for("late")) is False


# --- failing -----------------------------------------------------------------------------------


def test_a_failed_attempt_lets_the_page_wait_for_another(page, settings):
    settings.PAGE_MAX_ATTEMPTS = 3
    pages_claim(pool_id=page.pool_id, token="A", limit=1)

    outcome = page_attempt_failed(page_id=page.pk, token="A", pod_id=None, error="HTTP 500: boom")

    assert outcome == "retry"
    page = reload(page)
    assert (page.status, page.attempts, page.error, page.claim_token) == (
        Page.Status.PENDING,
        1,
        "HTTP 500: boom",
        "",
    )


def test_a_failed_attempt_with_a_lost_claim_changes_nothing(page):
    pages_claim(pool_id=page.pool_id, token="A", limit=1)

    assert page_attempt_failed(page_id=page.pk, token="B", pod_id=None, error="x") == "lost"
    assert reload(page).status == Page.Status.RUNNING


def test_a_page_that_spends_its_attempts_fails_with_its_error_and_the_job_is_partial(ordinary_user, settings):
    settings.PAGE_MAX_ATTEMPTS = 2
    job = submit(ordinary_user, {"report.pdf": pdf_bytes()})
    split(job)
    bad = job.pages.get(number=2)
    outcomes = []
    for attempt in (1, 2):
        claimed = pages_claim(pool_id=job.pool_id, token=f"T{attempt}", limit=10)
        for claim in claimed:
            if claim.id == bad.pk:
                error = f"HTTP 500: attempt {attempt}"
                outcomes.append(page_attempt_failed(page_id=claim.id, token=f"T{attempt}", pod_id=None, error=error))
            else:
                assert page_complete(page_id=claim.id, token=f"T{attempt}", pod_id=None, result=result_for("ok"))
    job = job_refresh(job_id=job.pk)

    assert outcomes == ["retry", "failed"]
    bad = reload(bad)
    assert (bad.status, bad.attempts, bad.error) == (Page.Status.FAILED, 2, "HTTP 500: attempt 2")
    assert job.status == Job.Status.PARTIAL
    assert job.page_counts()["done"] == 2
    assert pages_claim(pool_id=job.pool_id, token="T3", limit=10) == []


def test_a_final_failure_fails_the_page_at_once(page, settings):
    settings.PAGE_MAX_ATTEMPTS = 3
    pages_claim(pool_id=page.pool_id, token="A", limit=1)

    outcome = page_attempt_failed(page_id=page.pk, token="A", pod_id=None, error="the pod refused the page", final=True)

    assert outcome == "failed"
    assert reload(page).status == Page.Status.FAILED


def test_a_job_whose_every_page_failed_is_failed(ordinary_user):
    job = submit(ordinary_user, {"report.pdf": pdf_bytes(PAGES_TRUTH[:2])})
    split(job)

    complete_all(job, failures={(0, 1): "unreadable", (0, 2): "unreadable"})

    job = reload(job)
    assert job.status == Job.Status.FAILED
    assert job.finished_at is not None


def test_an_expired_claim_on_its_last_attempt_fails_the_page_with_a_clear_error(
    one_page_job, page, settings, django_capture_on_commit_callbacks
):
    settings.PAGE_MAX_ATTEMPTS = 1
    pages_claim(pool_id=page.pool_id, token="A", limit=1)
    expire_claims(page)

    with django_capture_on_commit_callbacks(execute=True):
        claimed = pages_claim(pool_id=page.pool_id, token="B", limit=1)

    assert claimed == []
    page = reload(page)
    assert page.status == Page.Status.FAILED
    assert page.error == "no result after 1 attempts (claims expired)"
    assert page.claim_token == ""
    assert reload(one_page_job).status == Job.Status.FAILED
    assert page_complete(page_id=page.pk, token="A", pod_id=None, result=result_for("late")) is False


def test_an_expired_claim_with_attempts_left_is_claimed_again(page, settings):
    settings.PAGE_MAX_ATTEMPTS = 2
    pages_claim(pool_id=page.pool_id, token="A", limit=1)
    expire_claims(page)

    claimed = pages_claim(pool_id=page.pool_id, token="B", limit=1)

    assert [c.attempts for c in claimed] == [2]
    assert reload(page).status == Page.Status.RUNNING


# --- cancel, retry -------------------------------------------------------------------------------


def test_cancel_ends_waiting_and_running_pages_and_refuses_later_results(ordinary_user):
    job = submit(ordinary_user, {"report.pdf": pdf_bytes()})
    split(job)
    running = pages_claim(pool_id=job.pool_id, token="A", limit=1)[0]

    job = job_cancel(job=job)

    assert job.status == Job.Status.CANCELLED
    assert job.finished_at is not None
    assert set(job.pages.values_list("status", flat=True)) == {Page.Status.CANCELLED}
    late = page_complete(page_id=running.id, token="A", pod_id=None, result=result_for("late"))
    assert late is False
    assert pages_claim(pool_id=job.pool_id, token="B", limit=10) == []
    assert job_refresh(job_id=job.pk).status == Job.Status.CANCELLED


def test_a_cancelled_jobs_page_left_waiting_is_never_claimed_nor_counted_as_demand(ordinary_user, local_pool):
    job = submit(ordinary_user, {"report.pdf": pdf_bytes()})
    split(job)
    job_cancel(job=job)
    # As a split racing the cancel could leave them: one page saved pending after the cancel,
    # one running under a claim that expired.
    job.pages.filter(number=1).update(status=Page.Status.PENDING, finished_at=None)
    job.pages.filter(number=2).update(status=Page.Status.RUNNING, claim_token="A",
                                      claim_expires_at=timezone.now() - timedelta(seconds=5))  # fmt: skip

    assert pages_claim(pool_id=job.pool_id, token="B", limit=10) == []
    assert pool_backlog(job.pool_id) == PoolBacklog(waiting=0, running=0)
    assert pages_waiting(pool_id=job.pool_id) == 0
    assert pool_demand(local_pool).waiting == 0


def test_cancel_has_the_scaler_look_again_once_committed(one_page_job, queued, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        job_cancel(job=one_page_job)

    assert queued() == ["pods.tasks.scaler_tick"]  # boots only its pages wanted stop now, not a schedule later


def test_cancel_leaves_done_pages_and_a_finished_job_alone(one_page_job):
    complete_all(one_page_job)

    job = job_cancel(job=one_page_job)

    assert job.status == Job.Status.DONE
    assert job.pages.get().status == Page.Status.DONE


def test_retry_failed_gives_failed_pages_fresh_attempts_and_runs_the_job_again(ordinary_user):
    job = submit(ordinary_user, {"report.pdf": pdf_bytes()})
    split(job)
    complete_all(job, failures={(0, 2): "HTTP 500: boom"})
    assert reload(job).status == Job.Status.PARTIAL

    retried = job_retry_failed(job=job)

    assert retried == 1
    job = reload(job)
    assert (job.status, job.finished_at) == (Job.Status.RUNNING, None)
    page = job.pages.get(number=2)
    assert (page.status, page.attempts, page.error) == (Page.Status.PENDING, 0, "")
    assert job.pages.filter(status=Page.Status.DONE).count() == 2

    complete_all(job)

    assert reload(job).status == Job.Status.DONE


def test_retry_failed_on_a_job_without_failures_does_nothing(one_page_job):
    complete_all(one_page_job)

    assert job_retry_failed(job=one_page_job) == 0
    assert reload(one_page_job).status == Job.Status.DONE


def test_pdfs_submitted_from_several_threads_at_once_use_pdfium_one_call_at_a_time(
    transactional_db, local_pool, ordinary_user, media_root, monkeypatch
):
    """The front checks each request's uploads on a thread of its own, and PDFium is not
    thread-safe (pypdfium2's documentation): concurrent submissions each get their PDFs' pages
    right, and no two PDFium calls overlap (submission.PDFIUM_LOCK)."""
    import threading
    import time

    import pypdfium2 as pdfium

    inside, most = [0], [0]
    count = threading.Lock()
    real_size = pdfium.PdfDocument.get_page_size

    def get_page_size(self, index):
        with count:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
        time.sleep(0.002)  # (widens the window another thread's call would overlap in)
        try:
            return real_size(self, index)
        finally:
            with count:
                inside[0] -= 1

    monkeypatch.setattr(pdfium.PdfDocument, "get_page_size", get_page_size)
    documents = [pdf_bytes(PAGES_TRUTH[: 1 + n % 3]) + f"\n% {n}\n".encode() for n in range(12)]
    start, errors, jobs = threading.Barrier(6), [], []

    def submitting(offset: int) -> None:
        try:
            start.wait(30)
            files = {f"d{offset + n}.pdf": documents[offset + n] for n in (0, 6)}
            jobs.append(submit(ordinary_user, files))
        except BaseException as exc:  # (reported below, with the others)
            errors.append(exc)
        finally:
            connection.close()  # this thread's own

    threads = [threading.Thread(target=submitting, args=(offset,)) for offset in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)

    assert errors == []
    assert most[0] == 1
    counts = sorted(d.page_count for job in jobs for d in job.documents.all())
    assert counts == sorted(1 + n % 3 for n in range(12))
