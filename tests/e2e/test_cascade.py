"""The confidence cascade end to end (issue 26): real processes, a local pool reading with tesseract
that escalates the pages it reads below its threshold to a local pool of rapidocr pods."""

from __future__ import annotations

import io
import json

import httpx
import numpy as np
import pytest
from django.test import Client
from PIL import Image

from accounts.models import ApiToken
from ocrjobs.models import Job
from pods.models import Pod, Pool
from tests.assertions import assert_every_page_done_once
from tests.factories import accuracy, render_page
from tools.processes import wait_for

pytestmark = pytest.mark.e2e

GUARD = 300  # against hangs only: two pools boot, and rapidocr reads on a shared CPU
CLEAN = ["The river authority report for the first quarter.", "Water levels rose by twelve centimetres."]
NOISY = ["Maintenance crews serviced four pumps in March.", "Costs stayed within the approved budget."]


def png(image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def noisy_page(lines: list[str]) -> bytes:
    """A page under heavy scanner noise (seeded): tesseract reads it with little confidence,
    rapidocr reads it."""
    pixels = np.asarray(render_page(lines, width=1400, height=600), dtype=np.float32)
    rng = np.random.default_rng(26)
    pixels = np.clip(pixels + rng.normal(0, 85, pixels.shape), 0, 255).astype(np.uint8)
    return png(Image.fromarray(pixels))


def test_a_page_tesseract_is_unsure_of_is_read_again_by_rapidocr(live_system, local_pool, admin_user):
    strong = Pool.objects.create(key="strong", provider="local", max_pods=1, lanes_per_pod=1,
                                 config={"env": {"ENGINE": "rapidocr", "RAPIDOCR_THREADS": "1"}})  # fmt: skip
    local_pool.escalation_pool, local_pool.escalation_threshold = strong, 90
    local_pool.save()
    _, token = ApiToken.issue(user=admin_user, name="e2e", scopes=["submit"])
    headers = {"Authorization": f"Bearer {token}"}
    files = [
        ("files", ("clean.png", png(render_page(CLEAN, width=1400, height=600)), "image/png")),
        ("files", ("noisy.png", noisy_page(NOISY), "image/png")),
    ]
    response = httpx.post(f"{live_system.url}/v1/jobs", headers=headers, files=files, data={"pool": "local"},
                          timeout=30)  # fmt: skip
    assert response.status_code == 201, response.text
    job_id = response.json()["id"]

    def finished():
        body = httpx.get(f"{live_system.url}/v1/jobs/{job_id}", headers=headers, timeout=10).json()
        return body if body["status"] in Job.FINISHED else None

    body = wait_for(finished, GUARD, lambda: f"job {job_id} did not finish\n{live_system.logs()}")
    assert body["status"] == "done", body
    job = Job.objects.get(pk=job_id)
    assert_every_page_done_once(job, pages=2)

    jsonl = httpx.get(f"{live_system.url}/v1/jobs/{job_id}/result.jsonl", headers=headers, timeout=10)
    clean, noisy = [json.loads(line) for line in jsonl.text.splitlines()]
    assert (clean["document"], clean["engine"], clean["escalated"]) == ("clean.png", "tesseract", False)
    assert clean["confidence"] >= 90
    assert (noisy["document"], noisy["engine"], noisy["escalated"]) == ("noisy.png", "rapidocr", True)
    first, second = noisy["cascade"]
    assert (first["pool"], first["engine"], second["pool"], second["engine"]) == (
        "local", "tesseract", "strong", "rapidocr",
    )  # fmt: skip
    assert first["confidence"] < 90 and second["confidence"] == noisy["confidence"]
    assert accuracy(noisy["text"], "\n".join(NOISY)) >= 0.9, noisy["text"]

    # Each stage on its own pool's pods, each with its own engine; the page's row keeps both.
    page = job.pages.get(document__name="noisy.png")
    assert page.escalated_from_id == local_pool.pk and page.pool_id == strong.pk
    assert page.first_pod.pool_id == local_pool.pk and page.pod.pool_id == strong.pk
    assert Pod.objects.get(pk=page.first_pod_id).engine.get("engine") == "tesseract"
    assert Pod.objects.get(pk=page.pod_id).engine.get("engine") == "rapidocr"
    client = Client()
    client.force_login(admin_user)
    html = client.get(job.get_absolute_url()).content.decode()
    assert "Escalated pages" in html and "strong: rapidocr" in html
