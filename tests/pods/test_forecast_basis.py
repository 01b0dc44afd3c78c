"""A forecast says what it rests on: a pool that has read no page and booted no pod has only the
settings' guesses (bench/storm.py on a fresh pool: +283 % minutes, +110 % dollars), and its
forecast is labelled a guess; the job page and the API then show the job forecast again on what the
pool has measured since, beside the forecast made at its submission."""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from ocrjobs.models import Job, Page
from pods.services import forecast
from tests.factories import PAGES_TRUTH, pdf_bytes
from tests.helpers import auth
from tests.ocrjobs import test_forecast
from tests.pods.test_forecast_vs_bill import make_booted

gpu_pool = test_forecast.gpu_pool  # a fixture: $0.50/h, guesses of 2 s a page and 60 s a boot


def measure(pool, owner, *, seconds: float = 0.5, boot: float = 10.0) -> None:
    """The pool reads four pages of ``seconds`` each on a pod that booted in ``boot`` seconds."""
    start = timezone.now() - timedelta(minutes=5)
    make_booted(pool, decided=start, created=start, ready=start + timedelta(seconds=boot), price="0.50")
    job = Job.objects.create(owner=owner, pool=pool, status=Job.Status.DONE)
    document = job.documents.create(position=0, name="m.pdf", kind="pdf", source="x", size_bytes=1, page_count=4)
    Page.objects.bulk_create([Page(job=job, document=document, pool=pool, number=n, status="done",
                                   seconds=seconds, finished_at=timezone.now()) for n in range(1, 5)])  # fmt: skip
    forecast._bases.clear()  # a front's reuse (FORECAST_BASIS_SECONDS) over: the pool read again


def a_job_forecast_on(pool, owner, pages: int = 100) -> Job:
    made = forecast.job_forecast(pages=pages, pool=pool)
    return Job.objects.create(owner=owner, pool=pool, forecast=made)


def test_a_fresh_pools_forecast_is_labelled_a_guess_and_a_measured_ones_is_not(gpu_pool, ordinary_user):
    fresh = forecast.pool_forecast(gpu_pool, pages=100)
    measure(gpu_pool, ordinary_user)
    measured = forecast.pool_forecast(gpu_pool, pages=100)

    assert fresh["basis"] == "guess" and fresh["guessed"] == ["seconds_per_page", "boot_seconds"]
    assert measured["basis"] == "measured" and measured["guessed"] == []


def test_a_job_forecast_on_a_guess_is_forecast_again_on_what_the_pool_measured_since(gpu_pool, ordinary_user):
    job = a_job_forecast_on(gpu_pool, ordinary_user)
    assert forecast.job_forecast_again(job) is None  # nothing measured since: nothing better to say
    made = job.forecast["pools"][0]

    measure(gpu_pool, ordinary_user, seconds=0.5, boot=10.0)
    again = forecast.job_forecast_again(job)

    assert again["basis"] == "measured" and again["based_on"]["seconds_per_page"] == 0.5
    # The same job as at its submission: its pages, the pages ahead of it and no pod ready then
    # (a pod ready now does not make the job's wait for its first pod vanish).
    assert again["based_on"]["pages_ahead"] == made["based_on"]["pages_ahead"]
    assert again["based_on"]["pods_ready"] is False
    cheapest = again["sizings"]["cheapest"]  # one 2-lane pod: 10 s boot wait, 100 pages × 0.5 s ÷ 2
    assert cheapest["minutes"] == round((10 + 25) / 60, 2) < made["sizings"]["cheapest"]["minutes"]


def test_a_forecast_made_on_measured_figures_stands_as_made(gpu_pool, ordinary_user):
    measure(gpu_pool, ordinary_user)
    job = a_job_forecast_on(gpu_pool, ordinary_user)

    assert job.forecast["pools"][0]["basis"] == "measured"
    assert forecast.job_forecast_again(job) is None


def test_the_job_page_says_the_forecast_was_a_guess_and_shows_it_again_on_measured_figures(
    client,
    gpu_pool,
    ordinary_user,
):
    job = a_job_forecast_on(gpu_pool, ordinary_user)
    client.force_login(ordinary_user)
    before = client.get(f"/jobs/{job.pk}/progress").content.decode()
    measure(gpu_pool, ordinary_user)
    after = client.get(f"/jobs/{job.pk}/progress").content.decode()

    assert "a guess: seconds_per_page, boot_seconds not measured yet" in before
    assert "Forecast again on what the pool has measured since" not in before
    assert "Forecast again on what the pool has measured since" in after


def test_the_api_answers_the_job_forecast_again_beside_the_one_made_at_submission(
    client,
    gpu_pool,
    ordinary_user,
    read_token,
):
    job = a_job_forecast_on(gpu_pool, ordinary_user)
    measure(gpu_pool, ordinary_user)

    body = client.get(f"/v1/jobs/{job.pk}", headers=auth(read_token)).json()

    assert body["forecast"]["pools"][0]["basis"] == "guess"
    assert body["forecast_again"]["basis"] == "measured"
    assert body["forecast_again"]["based_on"]["seconds_per_page"] == 0.5


def test_the_forms_forecast_says_a_fresh_pool_is_a_guess(client, gpu_pool, ordinary_user, media_root):
    client.force_login(ordinary_user)

    shown = client.post("/jobs/forecast", {"files": [pdf_file()], "pool": "gpu"}).content.decode()

    assert "gpu (a guess: seconds_per_page, boot_seconds not measured yet)" in shown


def pdf_file():
    from django.core.files.uploadedfile import SimpleUploadedFile

    return SimpleUploadedFile("a.pdf", pdf_bytes(PAGES_TRUTH[:1]))
