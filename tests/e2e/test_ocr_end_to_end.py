"""A three-page PDF with known text, OCRed by real processes: daphne, qcluster
workers and local pod subprocesses running tesseract; and how many pods the
shipped fleet sizing boots for it."""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import pytest
from django.test import Client

from accounts.models import ApiToken
from ocrjobs import selectors
from ocrjobs.models import Job
from pods.models import Pod, Pool
from tests.assertions import assert_every_page_done_once
from tests.factories import PAGES_TRUTH, accuracy, pdf_bytes
from tools.processes import REPO, wait_for

# Local tesseract pods, the embedded default: once, on SQLite. The scaled-out run submits over HTTP in
# test_multi_host.py, and kills processes mid-job on PostgreSQL + Redis in test_process_faults.py.
pytestmark = [pytest.mark.e2e, pytest.mark.once_sqlite]

TRUTH = ["\n".join(lines) for lines in PAGES_TRUTH]
GUARD = 180  # against hangs only


def _assert_pages_match_truth(texts: list[str]) -> None:
    assert len(texts) == len(TRUTH)
    for number, (got, truth) in enumerate(zip(texts, TRUTH, strict=True), start=1):
        score = accuracy(got, truth)
        assert score >= 0.98, f"page {number}: accuracy {score:.3f}\n got: {got!r}\nwant: {truth!r}"


def test_a_pdf_submitted_over_http_comes_back_as_text(live_system, admin_user):
    _, token = ApiToken.issue(user=admin_user, name="e2e", scopes=["submit"])
    headers = {"Authorization": f"Bearer {token}"}
    response = httpx.post(
        f"{live_system.url}/v1/jobs",
        headers=headers,
        files={"files": ("report.pdf", pdf_bytes(), "application/pdf")},
        data={"pool": "local"},
        timeout=30,
    )
    assert response.status_code == 201, response.text
    job_id = response.json()["id"]

    def finished():
        body = httpx.get(f"{live_system.url}/v1/jobs/{job_id}", headers=headers, timeout=10).json()
        return body if body["status"] in ("done", "partial", "failed") else None

    body = wait_for(finished, GUARD, lambda: f"job {job_id} did not finish\n{live_system.logs()}")
    assert body["status"] == "done", body
    assert body["pages"]["done"] == 3

    jsonl = httpx.get(f"{live_system.url}/v1/jobs/{job_id}/result.jsonl", headers=headers, timeout=10)
    records = [json.loads(line) for line in jsonl.text.splitlines()]
    assert [(r["document"], r["page"]) for r in records] == [("report.pdf", 1), ("report.pdf", 2), ("report.pdf", 3)]
    assert all(r["lines"] and 0 <= r["confidence"] <= 100 for r in records)
    _assert_pages_match_truth([r["text"] for r in records])

    text = httpx.get(f"{live_system.url}/v1/jobs/{job_id}/result.txt", headers=headers, timeout=10).text
    assert "river authority" in text
    job = Job.objects.get(pk=job_id)
    assert_every_page_done_once(job, pages=len(TRUTH))
    assert Pod.objects.filter(pool=job.pool, provider_id__gt="").exists()


def test_a_pdf_submitted_through_the_form_comes_back_as_text(live_system, ordinary_user):
    client = Client()
    client.force_login(ordinary_user)
    from django.core.files.uploadedfile import SimpleUploadedFile

    upload = SimpleUploadedFile("form-report.pdf", pdf_bytes(), content_type="application/pdf")
    response = client.post("/jobs/new", {"files": [upload], "pool": "local", "languages": "eng"})
    assert response.status_code == 302, response.content
    job = Job.objects.get(owner=ordinary_user)
    assert response["Location"] == job.get_absolute_url()

    def finished():
        job.refresh_from_db()
        return job.is_finished

    wait_for(finished, GUARD, lambda: f"job {job.pk} did not finish\n{live_system.logs()}")
    assert job.status == Job.Status.DONE
    document = job.documents.get()
    _assert_pages_match_truth(selectors.document_text(document).split("\f"))
    assert_every_page_done_once(job, pages=len(TRUTH))
    assert Pod.objects.filter(pool=job.pool, provider_id__gt="").exists()
    page = client.get(job.get_absolute_url())
    assert b"Quarterly report of the river authority" in page.content


def test_the_ocr_command_writes_one_text_file_per_document(live_system, tmp_path):
    source = tmp_path / "cli-report.pdf"
    source.write_bytes(pdf_bytes())
    out = tmp_path / "out"
    finished = subprocess.run(
        [sys.executable, "manage.py", "ocr", str(source), "--pool", "local", "--out", str(out)],
        cwd=REPO,
        env=live_system.env,
        capture_output=True,
        text=True,
        timeout=GUARD,
    )
    assert finished.returncode == 0, f"{finished.stderr}\n{live_system.logs()}"
    assert "3/3 pages" in finished.stderr  # the progress bar reached the end
    assert sorted(p.name for p in out.iterdir()) == ["cli-report.txt"]
    _assert_pages_match_truth((out / "cli-report.txt").read_text().split("\f"))


@pytest.mark.parametrize("live_system_env", [{"SCALE_TARGET_SECONDS": "2"}])
def test_a_small_backlog_boots_one_pod_on_the_shipped_cost_cap_where_the_time_target_wants_three(
    live_system, admin_user, local_pool
):
    # The workers size the fleet with the shipped SCALE_MAX_OVERHEAD (0.12): nothing in their
    # environment sets it.
    assert "SCALE_MAX_OVERHEAD" not in live_system.env
    Pool.objects.filter(pk=local_pool.pk).update(max_pods=3, max_parallel_boots=3, lanes_per_pod=1)
    _, token = ApiToken.issue(user=admin_user, name="e2e", scopes=["submit"])
    response = httpx.post(f"{live_system.url}/v1/jobs", headers={"Authorization": f"Bearer {token}"},
                          files={"files": ("report.pdf", pdf_bytes(), "application/pdf")}, data={"pool": "local"},
                          timeout=30)  # fmt: skip
    assert response.status_code == 201, response.text
    job = Job.objects.get(pk=response.json()["id"])

    def finished():
        job.refresh_from_db()
        return job.is_finished

    wait_for(finished, GUARD, lambda: f"job {job.pk} did not finish\n{live_system.logs()}")
    assert job.status == Job.Status.DONE
    # The time target alone wants one pod per page here (3 pages × 2 s guessed ÷ (1 lane × 2 s)): three.
    # Each pod costs its boot and its idle tail (60 s guessed + 300 s), far more than 12 % of 6 s of
    # work pays for: the cap leaves one pod, which the waiting pages always get.
    assert Pod.objects.filter(pool=local_pool).count() == 1
