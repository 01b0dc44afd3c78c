"""ocrjobs.services.pages: the life of a page: claims, results stored once by the current claim,
unclaims, renewals, requeues from a lost pod, and failed attempts."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.conf import settings
from django.utils import timezone

from ocrjobs.models import Job, Page
from ocrjobs.selectors import pages_waiting
from ocrjobs.services import pages as page_services
from ocrjobs.services.jobs import job_refresh
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
from pods.models import Pod
from tests.factories import PAGES_TRUTH, pdf_bytes
from tests.ocrjobs.helpers import answer_for, complete_all, files_under, reload, result_for, split, submit

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
        PageResult(page.pk, claim.job_id, claim.position, None, answer_for(text), attempt=claim.attempts)
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
    item = PageResult(page.pk, claim.job_id, claim.position, None, answer_for("once"), attempt=claim.attempts)
    assert pages_complete(token="A", items=[item]) == {page.pk}

    assert pages_complete(token="A", items=[item]) == set()

    page = reload(page)
    assert page.read_result()["text"] == "once\n"
    assert results_of(page) == ["once\n"]


def test_a_batch_stored_again_after_a_failed_try_stores_it_once(page, monkeypatch):
    from django.db import OperationalError

    claim = pages_claim(pool_id=page.pool_id, token="A", limit=1)[0]
    item = PageResult(page.pk, claim.job_id, claim.position, None, answer_for("once"), attempt=claim.attempts)

    def connection_dropped(result):
        raise OperationalError("server closed the connection unexpectedly")

    with monkeypatch.context() as patched:  # the database fails mid-store
        patched.setattr(page_services, "result_json", connection_dropped)
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

    late = PageResult(page.pk, old.job_id, old.position, pod.pk, answer_for("late"), attempt=old.attempts)
    assert pages_complete(token="A", items=[late]) == set()
    pages_assign_pods(token="A", assignments=[(page.pk, old.attempts, pod.pk)])
    assert page_attempt_failed(page_id=page.pk, token="A", pod_id=pod.pk, error="x",
                               attempt=old.attempts) == "lost"  # fmt: skip

    page = reload(page)
    assert (page.status, page.attempts, page.pod_id, page.error) == (Page.Status.RUNNING, 2, None, "")
    assert results_of(page) == []
    fresh = PageResult(page.pk, new.job_id, new.position, None, answer_for("fresh"), attempt=new.attempts)
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


def test_a_beat_renews_only_the_claims_about_to_expire_and_names_every_claim_held(local_pool, settings):
    settings.PAGE_CLAIM_SECONDS = 60
    near, far, lost = _pages(local_pool, 3)
    pages_claim(pool_id=local_pool.pk, token="A", limit=3)
    soon = timezone.now() + timedelta(seconds=5)
    Page.objects.filter(pk=near.pk).update(claim_expires_at=soon)
    far_expiry = reload(far).claim_expires_at
    Page.objects.filter(pk=lost.pk).update(status=Page.Status.CANCELLED, claim_token="")

    held = claims_renew(token="A", page_ids=[near.pk, far.pk, lost.pk], within=30)

    assert held == {near.pk, far.pk}
    assert reload(near).claim_expires_at > soon + timedelta(seconds=30)
    assert reload(far).claim_expires_at == far_expiry  # not written again: 60 s left, more than 30


def test_a_claim_token_is_only_ever_on_a_running_page(local_pool):
    from django.db import IntegrityError, transaction

    (page,) = _pages(local_pool, 1)
    pages_claim(pool_id=local_pool.pk, token="A", limit=1)

    with pytest.raises(IntegrityError), transaction.atomic():
        Page.objects.filter(pk=page.pk).update(status=Page.Status.DONE)  # its token kept: refused

    assert reload(page).status == Page.Status.RUNNING


@pytest.mark.once_postgres
def test_a_flush_never_joins_its_batch_by_a_nested_loop_however_stale_the_statistics(local_pool):
    """The statistics, taken while no page ran, say a token matches one page: a nested loop over
    the batch for each of the thousands that do was the planner's choice (1.2 s a flush at 256 pods
    x 8 lanes). The dispatcher's flush statements, as they are sent, are explained here."""
    from django.db import connection

    _pages(local_pool, 3000)
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {Page._meta.db_table}")
    claimed = pages_claim(pool_id=local_pool.pk, token="A", limit=2000)
    plans = []

    def explain(execute, sql, params, many, context):
        if sql.startswith("WITH v("):
            context["cursor"].execute(f"EXPLAIN {sql}", params)
            plans.append("\n".join(row[0] for row in context["cursor"].fetchall()))
        return execute(sql, params, many, context)

    batch = claimed[:500]
    with connection.execute_wrapper(explain):
        pages_assign_pods(token="A", assignments=[(c.id, c.attempts, None) for c in batch])
        stored = pages_complete(token="A", items=[
            PageResult(c.id, c.job_id, c.position, None, answer_for("x"), attempt=c.attempts) for c in batch
        ])  # fmt: skip

    assert stored == {c.id for c in batch}
    assert len(plans) == 2 and not [plan for plan in plans if "Nested Loop" in plan], plans


def _pages(pool, count: int) -> list[Page]:
    from ocrjobs.models import Document

    job = Job.objects.create(pool=pool)
    document = Document.objects.create(job=job, position=0, name="d.pdf", kind="pdf", source="jobs/d.pdf",
                                       size_bytes=1, page_count=count)  # fmt: skip
    return Page.objects.bulk_create(
        [Page(job=job, document=document, pool=pool, number=n) for n in range(1, count + 1)], batch_size=1000
    )
