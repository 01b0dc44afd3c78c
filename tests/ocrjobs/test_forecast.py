"""The forecast: POST /v1/jobs with dry_run answers pages, pods, minutes and dollars per pool and
sizing, and what they rest on, storing nothing; a real submission carries the same forecast; the
job page shows it next to the actual figures; the form shows it (htmx) before Submit."""

from __future__ import annotations

import json
import uuid
from decimal import Decimal

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.utils import timezone

from ocrjobs.models import Job, Page, SubmissionKey
from ocrjobs.services.pages import page_complete, pages_claim
from pods.models import Pool, PriceCatalogue
from tests.factories import PAGES_TRUTH, pdf_bytes
from tests.helpers import auth
from tests.ocrjobs.helpers import assert_nothing_made, complete_all, result_for, split, submit
from tests.ocrjobs.test_submit_api import assert_refused
from tests.pods.conftest import GOOD

pytestmark = pytest.mark.usefixtures("local_pool")


@pytest.fixture
def gpu_pool(db, settings) -> Pool:
    """A RunPod pool of up to 10 two-lane pods at $0.50/h (a stored catalogue); guesses of 2 s a
    page and 60 s a boot; a 60 s idle tail."""
    settings.SCALE_SECONDS_PER_PAGE_GUESS = 2.0
    settings.SCALE_BOOT_SECONDS_GUESS = 60.0
    settings.SCALE_TARGET_SECONDS = 120.0
    settings.SCALE_MAX_OVERHEAD = 0.12
    fetched = timezone.now() - timezone.timedelta(minutes=5)
    PriceCatalogue.objects.create(provider="runpod", fetched_at=fetched, offers=[
        {"gpu_type": GOOD, "cloud_type": "SECURE", "data_center": "", "cost_per_hr": "0.50"}])  # fmt: skip
    return Pool.objects.create(key="gpu", provider="runpod", max_pods=10, lanes_per_pod=2, idle_seconds=60,
                               config={"image": "ghcr.io/example/pod:1", "candidates": [
                                   {"gpu_types": [GOOD], "cloud_type": "SECURE", "data_centers": ["EU-RO-1"]}]})  # fmt: skip


def dry_run_files(client, token: str, files: dict[str, bytes], **fields):
    data = {"files": [SimpleUploadedFile(name, content) for name, content in files.items()], "dry_run": "true",
            **fields}  # fmt: skip
    return client.post("/v1/jobs", data, headers=auth(token))


def test_a_dry_run_counts_the_pages_and_stores_nothing(client, submit_token, media_root):
    response = dry_run_files(client, submit_token, {"a.pdf": pdf_bytes(PAGES_TRUTH[:2]),
                                                    "b.pdf": pdf_bytes(PAGES_TRUTH[:1])})  # fmt: skip

    assert response.status_code == 200, response.content
    body = response.json()
    assert body["dry_run"] is True
    assert body["forecast"]["pages"] == 3
    assert [pool["pool"] for pool in body["forecast"]["pools"]] == ["local"]
    assert set(body["forecast"]["pools"][0]["sizings"]) == {"fastest", "balanced", "cheapest"}
    assert_nothing_made(media_root)


def test_a_dry_run_figures_pods_minutes_and_dollars_for_each_sizing(client, submit_token, gpu_pool, media_root):
    # 100 pages × 2 s = 200 lane-s on two-lane pods at $0.50/h; each pod: 60 s boot + its share + 60 s idle.
    body = {"urls": ["https://example.org/a.pdf"], "pool": "gpu", "dry_run": True}
    empty = client.post("/v1/jobs", json.dumps(body), content_type="application/json", headers=auth(submit_token))
    assert empty.json()["forecast"]["documents_not_counted"] == 1

    from pods.services.forecast import pool_forecast

    forecast = pool_forecast(gpu_pool, pages=100)

    assert forecast["sizings"]["fastest"] == {"pods": 10, "minutes": 1.17, "dollars": 0.1806}  # 10 pods, 10 s each
    assert forecast["sizings"]["cheapest"] == {"pods": 1, "minutes": 2.67, "dollars": 0.0306}  # 1 pod, 100 s
    assert forecast["sizings"]["balanced"]["pods"] == 1  # 200 lane-s pay for no second boot
    based = forecast["based_on"]
    assert based["price_per_pod_hour"] == 0.5
    assert based["prices"]["fetched_at"] == PriceCatalogue.objects.get().fetched_at.isoformat()
    assert based["seconds_per_page"] == 2.0 and "guess" in based["seconds_per_page_source"]
    assert based["boot_seconds"] == 60.0 and "guess" in based["boot_seconds_source"]
    assert_nothing_made(media_root)


def test_the_forecast_uses_measured_seconds_per_page_once_there_are_some(gpu_pool, ordinary_user):
    from pods.services.forecast import pool_forecast

    job = Job.objects.create(owner=ordinary_user, pool=gpu_pool)
    document = job.documents.create(position=0, name="d.pdf", kind="pdf", source="x", size_bytes=1, page_count=4)
    Page.objects.bulk_create([Page(job=job, document=document, pool=gpu_pool, number=n, status="done",
                                   seconds=5.0, finished_at=timezone.now()) for n in range(1, 5)])  # fmt: skip

    based = pool_forecast(gpu_pool, pages=10)["based_on"]

    assert based["seconds_per_page"] == 5.0 and "measured" in based["seconds_per_page_source"]


def test_a_front_reuses_a_pools_measurements_for_forecast_basis_seconds(gpu_pool, ordinary_user, settings):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from pods.services import forecast

    settings.FORECAST_BASIS_SECONDS = 60
    forecast._bases.clear()
    first = forecast.pool_forecast(gpu_pool, pages=10)
    job = Job.objects.create(owner=ordinary_user, pool=gpu_pool)
    document = job.documents.create(position=0, name="d.pdf", kind="pdf", source="x", size_bytes=1, page_count=1)
    Page.objects.create(job=job, document=document, pool=gpu_pool, number=1, status="done", seconds=5.0,
                        finished_at=timezone.now())  # fmt: skip

    with CaptureQueriesContext(connection) as queries:
        again = forecast.pool_forecast(gpu_pool, pages=1000)

    # A burst of submissions reads the pool's measured pages, boots and prices once; each reads only
    # what moves fast: the pages ahead of it and whether a pod is ready (tests/pods/test_forecast_fresh.py).
    assert len(queries) == 4, [q["sql"] for q in queries.captured_queries]  # waiting, running, not split, ready
    assert again["based_on"] == first["based_on"]
    assert again["sizings"] != first["sizings"]  # figured for the job's own pages
    gpu_pool.config = {**gpu_pool.config, "image": "ghcr.io/example/pod:2"}
    assert forecast.pool_forecast(gpu_pool, pages=10)["based_on"]["seconds_per_page"] == 5.0  # another config: read
    settings.FORECAST_BASIS_SECONDS = 0
    forecast._bases.clear()


def test_a_pool_without_a_known_price_says_so(gpu_pool):
    from pods.services.forecast import pool_forecast

    PriceCatalogue.objects.all().delete()
    forecast = pool_forecast(gpu_pool, pages=10)

    assert forecast["sizings"]["fastest"]["dollars"] is None
    assert forecast["based_on"]["price_per_pod_hour"] is None


def test_a_dry_run_refuses_what_a_submission_refuses(client, submit_token, media_root, settings):
    settings.OCR_MAX_PAGES_PER_DOCUMENT = 1

    response = dry_run_files(client, submit_token, {"long.pdf": pdf_bytes(PAGES_TRUTH[:2])})

    assert_refused(response, 413, "long.pdf", "2 pages")
    assert_nothing_made(media_root)


def test_a_dry_run_with_an_idempotency_key_stores_no_key(client, submit_token):
    body = json.dumps({"urls": ["https://example.org/a.pdf"], "dry_run": True})
    headers = {**auth(submit_token), "Idempotency-Key": "dry"}

    response = client.post("/v1/jobs", body, content_type="application/json", headers=headers)

    assert response.status_code == 200
    assert SubmissionKey.objects.count() == 0 and Job.objects.count() == 0


def test_a_real_submission_returns_the_same_forecast_as_the_dry_run(client, submit_token):
    files = {"a.pdf": pdf_bytes(PAGES_TRUTH[:2])}
    dry = dry_run_files(client, submit_token, files).json()["forecast"]

    real = client.post("/v1/jobs", {"files": [SimpleUploadedFile("a.pdf", files["a.pdf"])]}, headers=auth(submit_token))

    assert real.status_code == 201
    assert real.json()["forecast"] == dry
    assert Job.objects.get().forecast == dry


def test_the_job_page_shows_the_forecast_beside_the_actual_figures(client, ordinary_user):
    job = submit(ordinary_user, {"a.pdf": pdf_bytes(PAGES_TRUTH[:2])})
    split(job)
    complete_all(job)
    client.force_login(ordinary_user)

    page = client.get(f"/jobs/{job.pk}").content.decode()

    assert "Forecast and actual" in page
    assert "Forecast (balanced)" in page and "Actual" in page
    assert "2 done" in page


def test_the_form_shows_the_forecast_with_htmx_before_submit(client, ordinary_user, media_root):
    client.force_login(ordinary_user)

    form = client.get("/jobs/new").content.decode()
    assert 'hx-post="/jobs/forecast"' in form and "change from:#id_files" in form

    response = client.post("/jobs/forecast", {"files": [SimpleUploadedFile("a.pdf", pdf_bytes(PAGES_TRUTH[:2]))],
                                              "pool": "local", "languages": "eng"})  # fmt: skip

    assert response.status_code == 200
    fragment = response.content.decode()
    assert fragment.startswith('<section id="forecast"')
    assert "2 pages" in fragment and "fastest" in fragment and "cheapest" in fragment
    assert_nothing_made(media_root)


def test_the_forms_forecast_shows_a_bad_files_error(client, ordinary_user, media_root):
    client.force_login(ordinary_user)

    response = client.post("/jobs/forecast", {"files": [SimpleUploadedFile("a.pdf", b"not a pdf")],
                                              "pool": "local", "languages": "eng"})  # fmt: skip

    assert response.status_code == 200
    assert "not a PDF, PNG, JPEG or TIFF" in response.content.decode()
    assert_nothing_made(media_root)


def test_max_dollars_decimal_survives_into_the_forecast_job(client, submit_token):
    body = json.dumps({"urls": ["https://example.org/a.pdf"], "max_dollars": 2})
    response = client.post("/v1/jobs", body, content_type="application/json", headers=auth(submit_token))

    assert Job.objects.get().max_dollars == Decimal("2.00")
    assert response.json()["forecast"]["documents_not_counted"] == 1


def test_a_pool_with_a_refused_configuration_has_no_price_and_does_not_stop_a_submission(client, submit_token):
    Pool.objects.create(key="broken", provider="runpod", config={"candidates": []})
    body = json.dumps({"urls": ["https://example.org/a.pdf"], "pool": "broken"})

    response = client.post("/v1/jobs", body, content_type="application/json", headers=auth(submit_token))

    assert response.status_code == 201, response.content
    broken = response.json()["forecast"]["pools"][0]
    assert broken["pool"] == "broken" and broken["based_on"]["price_per_pod_hour"] is None
    assert "refused" in broken["based_on"]["prices"]["source"]


def test_the_actual_figures_beside_the_forecast_update_as_the_job_runs(client, ordinary_user):
    # They are in the progress partial the job page polls, not only in the page as first served.
    job = submit(ordinary_user, {"a.pdf": pdf_bytes(PAGES_TRUTH[:2])})
    split(job)
    client.force_login(ordinary_user)
    token = uuid.uuid4().hex
    [first] = pages_claim(pool_id=job.pool_id, token=token, limit=1)
    assert page_complete(page_id=first.id, token=token, pod_id=None, result=result_for("one"))

    running = client.get(f"/jobs/{job.pk}/progress").content.decode()
    complete_all(job)
    finished = client.get(f"/jobs/{job.pk}/progress").content.decode()

    assert "Forecast (balanced)" in running and "Actual so far" in running and "1 done" in running
    assert "Forecast (balanced)" in finished and "2 done" in finished and "so far" not in finished
