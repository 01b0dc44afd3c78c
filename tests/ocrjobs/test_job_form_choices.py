"""The job form for people (issue 42, item 6): its words, the date-time picker, the pool it
takes when none is named, the forecast marking that pool, and the files a refused submit keeps."""

from __future__ import annotations

import re

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client
from django.utils import timezone

from ocrjobs.models import Job, KeptUpload
from ocrjobs.tasks import prune_staging
from pods.models import Pool, PriceCatalogue
from tests.factories import PAGES_TRUTH, pdf_bytes
from tests.helpers import page_text
from tests.ocrjobs.helpers import files_under
from tests.pods.conftest import GOOD

NEW = "/jobs/new"


@pytest.fixture
def gpu_first(db) -> Pool:
    """A paid RunPod pool, first by name (the form once listed pools by name and defaulted to the
    first), beside the free local one."""
    PriceCatalogue.objects.create(provider="runpod", fetched_at=timezone.now(), offers=[
        {"gpu_type": GOOD, "cloud_type": "SECURE", "data_center": "", "cost_per_hr": "0.50"}])  # fmt: skip
    gpu = Pool.objects.create(key="gpu", provider="runpod", max_pods=4, lanes_per_pod=2, config={
        "image": "ghcr.io/example/pod:1", "candidates": [{"gpu_types": [GOOD], "cloud_type": "SECURE"}]})  # fmt: skip
    Pool.objects.get_or_create(key="local", defaults={"provider": "local", "max_pods": 1, "lanes_per_pod": 2})
    return gpu


def one_page(name: str = "a.pdf") -> SimpleUploadedFile:
    return SimpleUploadedFile(name, pdf_bytes(PAGES_TRUTH[:1]))


def test_the_form_speaks_to_people_and_picks_dates_with_a_picker(bob, gpu_first):
    before = timezone.localtime().strftime("%Y-%m-%dT%H:%M")
    text = page_text(bob.get(NEW))
    after = timezone.localtime().strftime("%Y-%m-%dT%H:%M")

    assert "pool key" not in text
    assert re.search(r'<label for="id_pool">Pool</label>', text)
    assert '<option value="" selected>Cheapest that meets the forecast</option>' in text
    deadline = re.search(r'<input type="datetime-local" name="deadline"[^>]*>', text).group(0)
    minimum = re.search(r'min="([^"]+)"', deadline).group(1)
    assert minimum in {before, after}  # now, to the minute (the request may cross one)
    assert "placeholder" not in deadline and "2026-12-01" not in text  # no example already past
    assert "Fastest: more pods" in text


def test_every_field_of_the_form_is_on_the_page(bob, gpu_first):
    # The template lays the fields out by hand: a field the schema adds must be placed there too.
    from ocrjobs.forms import JobForm

    text = page_text(bob.get(NEW))

    missing = [name for name in JobForm().fields if f'name="{name}"' not in text]
    assert not missing, f"fields not on the page: {missing}"


def test_with_no_pool_named_the_job_goes_to_the_cheapest_open_pool(bob, gpu_first):
    response = bob.post(NEW, {"files": [one_page()], "pool": "", "languages": "eng"})

    assert response.status_code == 302, page_text(response)[-1500:]
    job = Job.objects.get()
    assert job.pool.key == "local"
    assert job.forecast["chosen"] == {"pool": "local", "sizing": "balanced", "by": "cheapest"}
    assert job.forecast["pools"][0]["pool"] == "local"  # the job's own forecast first, as its page reads it


def test_a_named_pool_is_taken_as_named(bob, gpu_first):
    response = bob.post(NEW, {"files": [one_page()], "pool": "gpu", "languages": "eng", "priority": "fastest"})

    assert response.status_code == 302
    assert Job.objects.get().forecast["chosen"] == {"pool": "gpu", "sizing": "fastest", "by": "named"}


def test_the_forecast_marks_the_chosen_pool_and_sizing_in_words(bob, gpu_first):
    response = bob.post("/jobs/forecast", {"files": [one_page()], "pool": "", "languages": "eng"})

    text = page_text(response)
    chosen = re.findall(r'<tr class="chosen"[^>]*>(.*?)</tr>', text, re.S)
    assert len(chosen) == 1 and "local" in chosen[0] and "balanced" in chosen[0] and "this job" in chosen[0]
    assert "no charge" in text and re.search(r"about \d+ minutes?|under a minute", text)
    assert re.search(r"under \$0\.01|\$\d+\.\d\d", text)  # the gpu pool's dollars, never "$0.00"
    assert "$0.00" not in text


def test_a_refused_submit_keeps_the_files_and_every_field(bob, gpu_first, media_root):
    refused = bob.post(NEW, {"files": [one_page("report.pdf"), one_page("note.pdf")], "pool": "gpu",
                             "languages": "eng; rm", "max_dollars": "3.50", "priority": "cheapest"})  # fmt: skip

    assert refused.status_code == 400
    text = page_text(refused)
    kept = list(KeptUpload.objects.order_by("pk"))
    assert [k.name for k in kept] == ["report.pdf", "note.pdf"]
    for k in kept:
        assert f'name="kept" value="{k.pk}" class="kept" checked' in text
    assert 'value="eng; rm"' in text and 'value="3.50"' in text
    assert '<option value="gpu" selected>' in text and '<option value="cheapest" selected>' in text

    # Sent again with the language fixed, one kept file unticked and no file chosen anew.
    accepted = bob.post(NEW, {"kept": [kept[0].pk], "pool": "gpu", "languages": "eng", "max_dollars": "3.50"})

    assert accepted.status_code == 302, page_text(accepted)[-1500:]
    job = Job.objects.get()
    assert [(d.name, d.page_count) for d in job.documents.all()] == [("report.pdf", 1)]
    assert not KeptUpload.objects.exists()
    assert not [p for p in files_under(media_root) if "kept" in p.parts]


def test_kept_files_are_their_owners_alone(bob, ordinary_user, outsider, gpu_first):
    bob.post(NEW, {"files": [one_page("mine.pdf")], "languages": "eng; rm"})
    mine = KeptUpload.objects.get()
    other = Client()
    other.force_login(outsider)

    response = other.post(NEW, {"kept": [mine.pk], "languages": "eng"})

    assert response.status_code == 400
    assert "no files" in page_text(response) and "mine.pdf" not in page_text(response)
    assert Job.objects.count() == 0
    assert KeptUpload.objects.get().owner == ordinary_user


def test_kept_files_go_once_expired(bob, gpu_first, media_root):
    bob.post(NEW, {"files": [one_page("old.pdf")], "languages": "eng; rm"})
    assert [p for p in files_under(media_root) if "kept" in p.parts]
    KeptUpload.objects.update(expires_at=timezone.now())

    prune_staging()

    assert not KeptUpload.objects.exists()
    assert not [p for p in files_under(media_root) if "kept" in p.parts]
    assert "old.pdf" not in page_text(bob.post(NEW, {"kept": ["1"], "languages": "eng"}))


# --- labels --------------------------------------------------------------------------------------


def test_labels_are_given_on_the_form_shown_in_the_job_list_and_found_by_filter(bob, gpu_first):
    response = bob.post(NEW, {"files": [one_page("q4.pdf")], "languages": "eng", "labels": "Invoices, 2026-q4"})
    assert response.status_code == 302
    bob.post(NEW, {"files": [one_page("other.pdf")], "languages": "eng", "labels": "letters"})
    labelled, other = Job.objects.order_by("pk")

    assert labelled.label_list == ["invoices", "2026-q4"]
    listed = page_text(bob.get("/jobs/"))
    assert '<a class="chip label" href="?label=invoices">invoices</a>' in listed
    found = page_text(bob.get("/jobs/?label=Invoices"))
    assert f'id="job-{labelled.pk}"' in found and f'id="job-{other.pk}"' not in found
    assert f'id="job-{labelled.pk}"' not in page_text(bob.get("/jobs/?label=invoice"))  # a whole label, not a part


def test_a_label_that_is_not_a_word_is_refused(bob, gpu_first, client, submit_token):
    refused = bob.post(NEW, {"files": [one_page()], "languages": "eng", "labels": "ok, not ok!"})

    assert refused.status_code == 400 and "a label is letters, digits" in page_text(refused)
    api = client.post("/v1/jobs", {"urls": ["https://example.org/a.pdf"], "labels": ["x" * 41]},
                      content_type="application/json", headers={"Authorization": f"Bearer {submit_token}"})  # fmt: skip
    assert api.status_code == 400 and "label" in api.json()["error"]
    assert Job.objects.count() == 0
