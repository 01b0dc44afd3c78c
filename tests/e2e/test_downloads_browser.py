"""A finished job's downloads in a real browser (Debian's chromium driven by Playwright) from the
real front (daphne): the job page offers each document's .txt, .md, .jsonl and searchable .pdf
and the job's .zip; clicking them downloads files whose contents are the pages' results (issue
25, item 5). The pages are read and the PDFs built here, as the viewer's browser test does."""

from __future__ import annotations

import io
import json
import zipfile

import pytest

from ocrjobs.models import Page
from ocrjobs.output_tasks import build_searchable_pdfs
from ocrjobs.services.outputs import searchable_pdfs_pending
from tests.e2e.test_browser import closing_its_connections
from tests.e2e.test_viewer_browser import DPI, read_every_page, session_context
from tests.factories import PAGES_TRUTH, accuracy, image_bytes, pdf_bytes
from tests.ocrjobs.helpers import split, submit
from tests.ocrjobs.test_outputs import text_of
from tools.processes import child_env, start_front

pytestmark = pytest.mark.e2e

SUFFIXES = ("txt", "md", "jsonl", "hocr", "alto.xml", "pdf")
# what each link's file is saved as: the searchable PDF apart from the original it was made from
SAVED_AS = {"txt": "txt", "md": "md", "jsonl": "jsonl", "hocr": "hocr", "alto.xml": "alto.xml", "pdf": "ocr.pdf"}
DOCUMENTS = {"report.pdf": pdf_bytes(PAGES_TRUTH[:2]), "note.png": image_bytes(["A photographed note."])}


@pytest.fixture
def front(transactional_db, tmp_path) -> str:
    """daphne alone on the test database, as deployed: the downloads stream under ASGI, on either
    database (the in-process live_server keeps the HTTPS redirect of the PostgreSQL run's
    settings, which the test's own settings cannot turn off). Its URL."""
    process, url = start_front(child_env(tmp_path), tmp_path)
    yield url
    process.stop()
    print(f"--- daphne ---\n{process.tail()}")


def download(page, link) -> tuple[str, bytes]:
    """Click ``link`` and wait for the browser's download: its file name and bytes."""
    with page.expect_download() as started:
        link.click()
    done = started.value
    assert done.failure() is None, done.failure()
    with open(done.path(), "rb") as f:
        return done.suggested_filename, f.read()


def linked(context, page, base_url: str, name: str) -> bytes:
    """What the page's link named ``name`` answers, fetched with the browser's session."""
    answer = context.request.get(base_url + page.get_by_role("link", name=name, exact=True).get_attribute("href"))
    assert answer.ok, answer.status
    return answer.body()


def page_texts(document_name: str) -> list[str]:
    pages = Page.objects.filter(document__name=document_name).order_by("number")
    return [page.read_result()["text"] for page in pages]


@closing_its_connections
def test_the_job_page_downloads_each_documents_outputs_and_the_jobs_zip(
    front, client, ordinary_user, local_pool, browser, monkeypatch
):
    # Playwright's sync API keeps an event loop on this thread, so Django would refuse the test's ORM calls.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    job = submit(ordinary_user, DOCUMENTS, searchable_pdf=True)
    split(job)
    read_every_page(job)  # the real tesseract engine; the job ends and asks for its searchable PDFs
    pending = searchable_pdfs_pending(job_id=job.pk)
    assert len(pending) == 2
    build_searchable_pdfs(pending)  # the worker's task, run here
    client.force_login(ordinary_user)
    context = session_context(browser, client, front)
    page = context.new_page()
    page.goto(f"{front}/jobs/{job.pk}")

    files: dict[str, bytes] = {}
    for name in DOCUMENTS:
        row = page.locator("tr", has_text=name)
        for suffix in SUFFIXES:
            filename, data = download(page, row.get_by_role("link", name=f".{suffix}", exact=True))
            assert filename == f"{name.rsplit('.', 1)[0]}.{SAVED_AS[suffix]}"
            files[filename] = data

    for name, stem in (("report.pdf", "report"), ("note.png", "note")):
        texts = page_texts(name)
        assert files[f"{stem}.txt"].decode() == "\f".join(texts)
        records = [json.loads(line) for line in files[f"{stem}.jsonl"].decode().splitlines()]
        assert [record["text"] for record in records] == texts
        assert [record["page"] for record in records] == list(range(1, len(texts) + 1))
        markdown = files[f"{stem}.md"].decode()
        assert markdown.startswith("<!-- page 1 -->")
        assert all(word in markdown for text in texts for word in text.split() if word.isalpha())
        # The searchable PDF's text layer reads as the pages' text, page for page.
        extracted = text_of(files[f"{stem}.ocr.pdf"])
        assert len(extracted) == len(texts)
        for got, truth in zip(extracted, texts, strict=True):
            assert accuracy(got, truth) >= 0.99, (got, truth)

    # Each record says at what DPI and pixel size the pod read its page: a PDF's rendered page,
    # an image as it is (no render, so no DPI).
    report = [json.loads(line) for line in files["report.jsonl"].decode().splitlines()]
    assert [(r["dpi"], r["width"], r["height"]) for r in report] == [(DPI, 1700, 2200)] * 2
    [note] = [json.loads(line) for line in files["note.jsonl"].decode().splitlines()]
    assert (note["dpi"], note["width"], note["height"]) == (None, 1400, 600)

    # The job's zip: every output, the documents' under documents/, the same bytes as one by one.
    filename, data = download(page, page.get_by_role("link", name="everything (.zip)"))
    assert filename == f"job-{job.pk}.zip"
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        assert archive.testzip() is None
        members = archive.namelist()
        zipped = {member: archive.read(member) for member in members}
    documents = [f"documents/{stem}.{SAVED_AS[suffix]}" for stem in ("report", "note") for suffix in SUFFIXES]
    assert members == ["result.txt", "result.md", "result.jsonl", *documents]
    for member in documents:
        assert zipped[member] == files[member.removeprefix("documents/")], member
    # The job's result.txt and result.jsonl, linked on the page: the zip's are the same bytes.
    for member in ("result.txt", "result.jsonl"):
        assert zipped[member] == linked(context, page, front, member), member
    assert "Water levels rose" in zipped["result.txt"].decode()
    context.close()
