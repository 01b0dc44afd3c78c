"""A page read but unusable as it stands is a warning on the page and its job, never a silent
success (issue 40): stored with its result, counted in the API, shown on the job page and in the
viewer, written to result.jsonl."""

from __future__ import annotations

import json

import pytest

from ocrjobs.models import Job
from ocrjobs.services.jobs import job_refresh
from tests.factories import image_bytes
from tests.helpers import auth
from tests.ocrjobs.helpers import complete_all, result_for, split, submit

pytestmark = pytest.mark.usefixtures("local_pool")

GARBAGE = {**result_for("AN NNIT 6F6867# XATAL"), "confidence": 4.0}
UNKNOWN_WAY_UP = {**result_for("x7 q"), "confidence": 45.0,
                  "warnings": ["orientation unknown: too little text to tell which way up the page is"]}  # fmt: skip
BLANK = {**result_for(""), "text": "", "lines": [], "confidence": 0.0}


@pytest.fixture
def three_pages(ordinary_user) -> Job:
    job = submit(ordinary_user, {f"{name}.png": image_bytes([name]) for name in ("good", "garbage", "blank")})
    split(job)
    return job


def finish(job: Job, *results: dict) -> Job:
    complete_all(job, results={(position, 1): result for position, result in enumerate(results)})
    return job_refresh(job_id=job.pk)


def test_a_page_read_under_the_confidence_threshold_carries_a_warning_and_is_counted(three_pages, settings):
    settings.OCR_WARN_CONFIDENCE_BELOW = 30.0

    job = finish(three_pages, result_for("a good page"), GARBAGE, BLANK)

    assert job.status == Job.Status.DONE
    assert job.page_counts()["warnings"] == 1
    pages = {page.document.name: page for page in job.pages.select_related("document")}
    assert pages["garbage.png"].warnings == 1
    assert pages["garbage.png"].read_result()["warnings"] == [
        "low confidence: read at 4, under 30; the text may be wrong"
    ]
    assert (pages["good.png"].warnings, pages["blank.png"].warnings) == (0, 0)  # a blank page is no warning
    assert "warnings" not in pages["good.png"].read_result()


def test_the_pods_own_warnings_are_kept_and_counted(three_pages):
    job = finish(three_pages, UNKNOWN_WAY_UP, result_for("fine"), result_for("fine too"))

    page = job.pages.get(document__position=0)
    assert page.warnings == 1 and page.read_result()["warnings"] == UNKNOWN_WAY_UP["warnings"]
    assert job.page_counts()["warnings"] == 1


def test_the_api_the_job_page_the_viewer_and_result_jsonl_show_the_warnings(client, submit_token, three_pages,
                                                                             ordinary_user):  # fmt: skip
    finish(three_pages, result_for("a good page"), GARBAGE, BLANK)

    body = client.get(f"/v1/jobs/{three_pages.pk}", headers=auth(submit_token)).json()
    records = [json.loads(line) for line in client.get(f"/v1/jobs/{three_pages.pk}/result.jsonl",
                                                       headers=auth(submit_token)).streaming_content]  # fmt: skip
    client.force_login(ordinary_user)
    page = client.get(f"/jobs/{three_pages.pk}").content.decode()

    assert body["pages"]["warnings"] == 1 and body["status"] == "done"
    assert [record["warnings"] for record in records] == [[], [GARBAGE_WARNING], []]
    assert 'id="job-warnings">1 page read with a warning' in page
    assert f"warning: {GARBAGE_WARNING}" in page


GARBAGE_WARNING = "low confidence: read at 4, under 30; the text may be wrong"


def test_the_viewer_says_how_a_page_was_turned_and_skewed(client, three_pages, ordinary_user):
    turned = {**result_for("read upside down"), "rotation": 180, "skew": -2.5}
    finish(three_pages, turned, result_for("level"), result_for("level too"))
    client.force_login(ordinary_user)

    page = client.get(f"/jobs/{three_pages.pk}").content.decode()

    assert "turned 180° (read upright) · skew -2.5°" in page
