"""The API's output shapes live in the API layer (ocrjobs/serializers.py); the models keep none."""

from __future__ import annotations

import json

from django.apps import apps

from ocrjobs.serializers import document_dict, job_dict
from tests.factories import image_bytes
from tests.ocrjobs.helpers import submit

JOB_KEYS = ["id", "status", "pool", "languages", "text_mode", "skip_text_pages", "searchable_pdf", "max_dollars",
            "deadline", "priority", "forecast", "callback_url", "labels", "created_at", "finished_at", "pages",
            "documents"]  # fmt: skip
DOCUMENT_KEYS = ["id", "name", "kind", "url", "size_bytes", "page_count", "status", "error"]


def test_the_ocrjobs_models_keep_no_api_shape():
    shaped = [model.__name__ for model in apps.get_app_config("ocrjobs").get_models() if hasattr(model, "to_dict")]

    assert shaped == []


def test_a_jobs_shape_is_the_apis_in_its_order_and_reads_as_json(ordinary_user, local_pool, media_root):
    job = submit(ordinary_user, {"a.png": image_bytes(["a"])}, labels=["box-7"])

    shown = job_dict(job)

    assert list(shown) == JOB_KEYS
    assert [list(document) for document in shown["documents"]] == [DOCUMENT_KEYS]
    assert shown["documents"] == [document_dict(job.documents.get())]
    assert shown["labels"] == ["box-7"] and shown["pool"] == "local" and shown["finished_at"] is None
    assert json.loads(json.dumps(shown)) == shown
