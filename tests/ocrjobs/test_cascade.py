"""The confidence cascade (issue 26): a page read below its pool's threshold is read again in the
escalation pool, once, as a page state change in the database; its result carries both readings."""

from __future__ import annotations

import json
import uuid

import pytest
from django.core.exceptions import ValidationError
from django.test import override_settings

from ocrjobs import selectors
from ocrjobs.models import Job, Page
from ocrjobs.services.jobs import job_refresh
from ocrjobs.services.pages import PageResult, page_attempt_failed, pages_claim, pages_complete
from pods.models import Pod, Pool
from pods.poolconfig import PoolConfigError, local_pod_env, parse_config
from pods.services import forecast
from podserver.answers import PageAnswer
from tests.assertions import assert_every_page_done_once
from tests.factories import image_bytes
from tests.ocrjobs.helpers import split, submit


def reading(engine: str, confidence: float, text: str = "a page") -> dict:
    return {"text": text, "lines": [], "confidence": confidence, "width": 10, "height": 10, "engine": engine,
            "seconds": 0.5}  # fmt: skip


def _job(owner, pool: Pool, pages: int = 3) -> Job:
    job = submit(owner, {f"p{n}.png": image_bytes([f"page {n}"]) for n in range(pages)}, pool_key=pool.key)
    split(job)
    return job


def _read(pool: Pool, confidences: list[float], *, engine: str, pod: Pod | None = None) -> tuple[str, set[int]]:
    """Claim the pool's waiting pages and store a reading of each (by page id order)."""
    token = uuid.uuid4().hex
    claimed = sorted(pages_claim(pool_id=pool.pk, token=token, limit=100), key=lambda c: c.id)
    assert len(claimed) == len(confidences)
    items = [
        PageResult(
            c.id, c.job_id, c.position, pod.pk if pod else None, PageAnswer(**reading(engine, conf)), seconds=2.0
        )
        for c, conf in zip(claimed, confidences, strict=True)
    ]
    return token, pages_complete(token=token, items=items)


def test_a_page_below_the_threshold_waits_in_the_escalation_pool_with_its_first_reading(
    cascade, ordinary_user, queued, django_capture_on_commit_callbacks
):
    cheap, strong = cascade
    job = _job(ordinary_user, cheap)
    Pool.objects.update(nudged_at=None)
    with django_capture_on_commit_callbacks(execute=True):
        _, stored = _read(cheap, [95, 40, 79.9], engine="tesseract")
    assert len(stored) == 3  # every result was taken: one stored, two escalated
    pages = list(job.pages.order_by("id"))
    assert [p.status for p in pages] == ["done", "pending", "pending"]
    assert [p.pool_id for p in pages] == [cheap.pk, strong.pk, strong.pk]
    assert pages[1].escalated_from_id == cheap.pk and pages[1].first_confidence == 40
    assert json.loads(pages[1].first_result)["engine"] == "tesseract"
    assert pages[1].attempts == 0 and pages[1].claim_token == "" and pages[1].result == ""
    assert pages_claim(pool_id=cheap.pk, token="again", limit=10) == []  # not the first pool's any more
    job_refresh(job_id=job.pk)
    job.refresh_from_db()
    assert job.status == Job.Status.RUNNING  # its escalated pages still wait
    strong.refresh_from_db()
    assert strong.nudged_at is not None  # the escalation pool's scaler was nudged


def test_the_escalated_result_keeps_both_engines_names_and_confidences(cascade, ordinary_user):
    cheap, strong = cascade
    job = _job(ordinary_user, cheap, pages=2)
    _read(cheap, [95, 30], engine="tesseract")
    _, stored = _read(strong, [88], engine="rapidocr")
    assert len(stored) == 1
    job_refresh(job_id=job.pk)
    assert_every_page_done_once(job, pages=2)
    page = job.pages.get(escalated_from=cheap)
    result = page.read_result()
    assert result["engine"] == "rapidocr" and result["escalated"] is True
    assert [(s["pool"], s["engine"], s["confidence"]) for s in result["cascade"]] == [
        ("cheap", "tesseract", 30.0), ("strong", "rapidocr", 88.0),
    ]  # fmt: skip
    assert page.confidence == 88
    records = [json.loads(line) for line in "".join(selectors.job_result_jsonl(job)).splitlines()]
    assert [r["escalated"] for r in records] == [False, True]
    assert records[1]["cascade"][0]["engine"] == "tesseract" and records[1]["engine"] == "rapidocr"


def test_a_page_escalates_at_most_once(cascade, ordinary_user):
    cheap, strong = cascade
    strong.escalation_pool, strong.escalation_threshold = cheap, 100  # a loop back, if it were followed
    strong.save()
    job = _job(ordinary_user, cheap, pages=1)
    _read(cheap, [10], engine="tesseract")
    _, stored = _read(strong, [20], engine="rapidocr")  # below the strong pool's own threshold too
    assert len(stored) == 1
    page = job.pages.get()
    assert page.status == Page.Status.DONE and page.pool_id == strong.pk and page.read_result()["escalated"]


def test_a_late_first_reading_after_the_escalation_is_refused(cascade, ordinary_user):
    cheap, strong = cascade
    job = _job(ordinary_user, cheap, pages=1)
    token, _ = _read(cheap, [10], engine="tesseract")
    page = job.pages.get()
    late = PageResult(page.pk, job.pk, 0, None, PageAnswer(**reading("tesseract", 99)), attempt=1)
    assert pages_complete(token=token, items=[late]) == set()  # the first claim is gone with the move
    page.refresh_from_db()
    assert page.status == Page.Status.PENDING and page.result == "" and page.first_confidence == 10


def test_an_escalation_that_fails_keeps_the_first_reading(cascade, ordinary_user):
    cheap, strong = cascade
    job = _job(ordinary_user, cheap, pages=1)
    _read(cheap, [10], engine="tesseract")
    token = "second"
    (claim,) = pages_claim(pool_id=strong.pk, token=token, limit=10)
    assert page_attempt_failed(page_id=claim.id, token=token, pod_id=None, error="bad", final=True) == "failed"
    job_refresh(job_id=job.pk)
    assert_every_page_done_once(job, pages=1)
    result = job.pages.get().read_result()
    assert result["engine"] == "tesseract" and result["escalated"] is False
    assert result["cascade"][1] == {"pool": "strong", "error": "bad"}


@override_settings(PAGE_MAX_ATTEMPTS=1, PAGE_CLAIM_SECONDS=-1)
def test_an_escalation_whose_claims_expire_keeps_the_first_reading(cascade, ordinary_user):
    cheap, strong = cascade
    job = _job(ordinary_user, cheap, pages=1)
    _read(cheap, [10], engine="tesseract")
    assert len(pages_claim(pool_id=strong.pk, token="lost", limit=10)) == 1  # expires at once
    pages_claim(pool_id=strong.pk, token="sweeper", limit=10)  # its sweep
    page = job.pages.get()
    assert page.status == Page.Status.DONE and page.read_result()["engine"] == "tesseract"
    assert "attempts" in page.read_result()["cascade"][1]["error"]


def test_spend_is_attributed_per_stage(cascade, ordinary_user):
    cheap, strong = cascade
    first_pod = Pod.objects.create(pool=cheap, name="fa-cheap-0", state=Pod.State.READY)
    second_pod = Pod.objects.create(pool=strong, name="fa-strong-0", state=Pod.State.READY)
    job = _job(ordinary_user, cheap, pages=2)
    _read(cheap, [95, 30], engine="tesseract", pod=first_pod)
    _read(strong, [90], engine="rapidocr", pod=second_pod)
    busy = selectors.busy_seconds(pod_ids=[first_pod.pk, second_pod.pk])
    assert busy == {(first_pod.pk, job.pk): 4.0, (second_pod.pk, job.pk): 2.0}  # both first readings, one second


def test_the_forecast_counts_the_share_escalated_over_the_pools_last_pages(cascade, ordinary_user, settings):
    settings.FORECAST_BASIS_SECONDS = 0
    cheap, strong = cascade
    guessed = forecast.pool_forecast(cheap, pages=100)["escalation"]
    assert guessed["share"] == forecast.ESCALATED_SHARE_GUESS and guessed["share_source"].startswith("guess")
    _job(ordinary_user, cheap, pages=4)
    _read(cheap, [95, 30, 20, 90], engine="tesseract")
    assert selectors.pool_escalated_share(cheap.pk) == (0.5, 4)
    figures = forecast.pool_forecast(cheap, pages=100)
    assert figures["escalation"]["share"] == 0.5 and figures["escalation"]["pages"] == 50
    assert figures["escalation"]["pool"] == "strong" and "last 4 pages" in figures["escalation"]["share_source"]
    assert "escalation" not in forecast.pool_forecast(strong, pages=100)


def test_the_job_page_lists_the_escalated_pages(cascade, ordinary_user, client):
    cheap, _ = cascade
    job = _job(ordinary_user, cheap, pages=2)
    _read(cheap, [95, 30], engine="tesseract")
    client.force_login(ordinary_user)
    page = client.get(job.get_absolute_url()).content.decode()
    assert "Escalated pages" in page and "1 page read below cheap" in page
    assert "cheap: tesseract 30.0" in page and "strong: waiting" in page


def test_a_pool_escalation_is_checked(cascade):
    cheap, strong = cascade
    cheap.escalation_threshold = None
    with pytest.raises(ValidationError, match="go together"):
        cheap.clean()
    strong.escalation_pool, strong.escalation_threshold = strong, 50
    with pytest.raises(ValidationError, match="itself"):
        strong.clean()


def test_a_local_pool_sets_only_its_pods_engine_knobs(cascade):
    _, strong = cascade
    assert local_pod_env(strong) == {"ENGINE": "rapidocr"}
    assert parse_config("local", {"env": {"ENGINE": "tesseract"}}) is None
    with pytest.raises(PoolConfigError, match="sets only"):
        parse_config("local", {"env": {"SECRET_KEY": "x"}})
    with pytest.raises(PoolConfigError):
        parse_config("local", {"image": "x"})
