"""The cascade holds a page to its job's budget (issue 26): a page of a job whose budget is spent
is not escalated (it is done with its first reading, the budget named in its cascade), and an
escalated page waiting in the escalation pool boots no pod there once its job's budget is spent:
the scaler's tick keeps its first reading."""

from __future__ import annotations

import uuid
from decimal import Decimal

from django.utils import timezone

from ocrjobs.models import Job, Page
from ocrjobs.services.escalation_budget import OWNERS_DAY
from ocrjobs.services.jobs import job_refresh
from ocrjobs.services.pages import pages_claim
from pods.models import Pod, Pool, SpendEntry, pod_name
from pods.services import scaler
from tests.factories import image_bytes
from tests.ocrjobs.helpers import split, submit
from tests.ocrjobs.test_cascade import _read


def _job(owner, pool: Pool, *, max_dollars: str, pages: int = 2) -> Job:
    job = submit(owner, {f"p{n}.png": image_bytes([f"page {n}"]) for n in range(pages)}, pool_key=pool.key)
    Job.objects.filter(pk=job.pk).update(max_dollars=Decimal(max_dollars))
    split(job)
    return job


def _spend(job: Job, pool: Pool, dollars: str) -> None:
    """What an ended pod of ``pool`` cost ``job``."""
    pod = Pod.objects.create(pool=pool, name=pod_name(pool, uuid.uuid4().hex[:8]), lanes=1,
                             state=Pod.State.TERMINATED, ended_at=timezone.now())  # fmt: skip
    SpendEntry.objects.create(pod=pod, pool=pool, job=job, dollars=Decimal(dollars), seconds=60)


def _kept_by_budget(page: Page) -> None:
    """The page is done with its first reading (tesseract's, at 40), the budget named as why."""
    page.refresh_from_db()
    assert page.status == Page.Status.DONE and page.confidence == 40
    result = page.read_result()
    assert result["engine"] == "tesseract" and result["escalated"] is False
    first, second = result["cascade"]
    assert (first["pool"], first["engine"], first["confidence"]) == ("cheap", "tesseract", 40.0)
    assert second["pool"] == "strong" and "budget of $0.05 is spent" in second["skipped"]
    job_refresh(job_id=page.job_id)
    assert Job.objects.get(pk=page.job_id).status == Job.Status.DONE


def test_a_page_of_a_job_whose_budget_is_spent_keeps_its_first_reading(cascade, ordinary_user):
    cheap, strong = cascade
    job = _job(ordinary_user, cheap, max_dollars="0.05")
    _spend(job, cheap, "0.05")
    assert len(_read(cheap, [95, 40], engine="tesseract")[1]) == 2
    page = job.pages.order_by("id").last()
    assert page.pool_id == cheap.pk and page.escalated_from_id is None
    assert pages_claim(pool_id=strong.pk, token="t", limit=10) == []  # nothing waits in the escalation pool
    _kept_by_budget(page)


def test_a_job_within_its_budget_still_escalates(cascade, ordinary_user):
    cheap, strong = cascade
    job = _job(ordinary_user, cheap, max_dollars="0.05")
    _spend(job, cheap, "0.04")
    _read(cheap, [95, 40], engine="tesseract")
    page = job.pages.order_by("id").last()
    assert page.status == Page.Status.PENDING and page.pool_id == strong.pk and page.escalated_from_id == cheap.pk


def test_an_escalated_page_boots_no_pod_once_its_jobs_budget_is_spent(cascade, ordinary_user):
    cheap, strong = cascade
    job = _job(ordinary_user, cheap, max_dollars="0.05")
    _read(cheap, [95, 40], engine="tesseract")  # escalated within budget
    page = job.pages.get(escalated_from=cheap)
    assert page.status == Page.Status.PENDING and page.pool_id == strong.pk
    _spend(job, cheap, "0.06")  # the first pool's pods spent the rest meanwhile
    result = scaler.pool_tick(pool=strong)
    assert result.booted == [] and not strong.pods.exists()
    _kept_by_budget(page)


def test_the_escalation_pool_boots_for_an_escalated_page_within_budget(cascade, ordinary_user):
    cheap, strong = cascade
    job = _job(ordinary_user, cheap, max_dollars="0.05")
    _read(cheap, [95, 40], engine="tesseract")
    assert len(scaler.pool_tick(pool=strong).booted) == 1  # the control: within budget, a pod boots
    assert job.pages.get(escalated_from=cheap).status == Page.Status.PENDING


# --- the owner's day (issue 38): jobs running at once share it ------------------------------------


def _kept_by_owners_day(page: Page) -> None:
    page.refresh_from_db()
    assert page.status == Page.Status.DONE and page.confidence == 40
    second = page.read_result()["cascade"][1]
    assert second["pool"] == "strong" and second["skipped"] == OWNERS_DAY


def test_an_escalated_page_boots_no_pod_once_its_owners_jobs_together_spent_the_day(cascade, ordinary_user, settings):
    cheap, strong = cascade
    settings.USER_DOLLARS_PER_DAY = Decimal("0.10")
    job = _job(ordinary_user, cheap, max_dollars="0.10")
    _read(cheap, [95, 40], engine="tesseract")  # escalated within the day
    page = job.pages.get(escalated_from=cheap)
    other = _job(ordinary_user, cheap, max_dollars="0.10")
    _spend(job, cheap, "0.04")
    _spend(other, cheap, "0.06")  # neither job's own budget is spent; together they spent the day

    assert scaler.pool_demand(strong).capped_jobs == [job.pk]
    assert scaler.pool_tick(pool=strong).booted == [] and not strong.pods.exists()
    _kept_by_owners_day(page)


def test_a_page_is_not_escalated_once_its_owners_day_is_spent(cascade, ordinary_user, settings):
    cheap, strong = cascade
    settings.USER_DOLLARS_PER_DAY = Decimal("0.10")
    job = _job(ordinary_user, cheap, max_dollars="0.10")
    other = _job(ordinary_user, cheap, max_dollars="0.10")
    other.pages.update(status=Page.Status.CANCELLED)
    _spend(other, cheap, "0.10")  # the owner's other job of the day spent it

    _read(cheap, [95, 40], engine="tesseract")

    assert pages_claim(pool_id=strong.pk, token="t", limit=10) == []
    _kept_by_owners_day(job.pages.order_by("id").last())


def test_another_users_day_does_not_hold_this_ones_pages(cascade, ordinary_user, outsider, settings):
    cheap, strong = cascade
    settings.USER_DOLLARS_PER_DAY = Decimal("0.10")
    job = _job(ordinary_user, cheap, max_dollars="0.10")
    _read(cheap, [95, 40], engine="tesseract")
    _spend(_job(outsider, cheap, max_dollars="0.10"), cheap, "0.10")  # the outsider's day is spent

    assert len(scaler.pool_tick(pool=strong).booted) == 1
    assert job.pages.get(escalated_from=cheap).status == Page.Status.PENDING
