"""Each submission's forecast reads its pool's pages ahead and ready pods at that moment, though the
slow-moving figures (seconds a page, boots, price) are reused for FORECAST_BASIS_SECONDS: two jobs
submitted back to back, the second waits for the first's pages (reused, it saw none ahead, and
bench/storm.py's later jobs were forecast as if alone)."""

from __future__ import annotations

from ocrjobs.models import Job
from pods.models import Pod
from tests.factories import pdf_bytes
from tests.ocrjobs.helpers import submit


def ahead_of(job: Job) -> int:
    return job.forecast["pools"][0]["based_on"]["pages_ahead"]


def test_the_second_of_two_jobs_submitted_together_waits_for_the_firsts_pages(ordinary_user, local_pool, settings):
    settings.FORECAST_BASIS_SECONDS = 3600  # the slow figures reused for both submissions
    first = submit(ordinary_user, {"a.pdf": pdf_bytes(["one", "two", "three"])})
    second = submit(ordinary_user, {"b.pdf": pdf_bytes(["four"])})
    assert ahead_of(first) == 0
    assert ahead_of(second) == 3  # the first job's pages, not split yet


def test_a_pod_ready_since_the_last_forecast_is_seen(ordinary_user, local_pool, settings):
    settings.FORECAST_BASIS_SECONDS = 3600
    before = submit(ordinary_user, {"a.pdf": pdf_bytes(["one"])})
    Pod.objects.create(pool=local_pool, name="ready-one", state=Pod.State.READY, lanes=1)
    after = submit(ordinary_user, {"b.pdf": pdf_bytes(["two"])})
    assert before.forecast["pools"][0]["based_on"]["pods_ready"] is False
    assert after.forecast["pools"][0]["based_on"]["pods_ready"] is True
