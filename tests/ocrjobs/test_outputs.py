"""Issue 25's outputs: searchable PDFs built by a worker, Markdown, downloads per document and the
job's zip, streamed; who may fetch them; manage.py ocr --format."""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path

import pikepdf
import pypdfium2 as pdfium
import pytest
from PIL import Image
from reportlab.pdfgen import canvas

from accounts.models import ApiToken
from fleetadmin.clusters import OUTPUTS, SHORT
from ocrjobs import downloads
from ocrjobs.models import Job, Page, SearchablePdf
from ocrjobs.output_tasks import request_searchable_pdfs
from ocrjobs.results import StoredResult
from ocrjobs.services import searchable_pdf
from ocrjobs.services.jobs import job_refresh
from ocrjobs.services.outputs import document_pdf_request, page_markdown
from ocrjobs.services.searchable_pdf import searchable_pdf_build
from ocrjobs.storage import documents
from tests.factories import PAGES_TRUTH, pdf_bytes
from tests.helpers import auth
from tests.ocrjobs.helpers import complete_all, split, submit, tiff_bytes

WIDTH, HEIGHT = 1000, 500  # the pixels the made-up pod read each page at


def boxed(lines: list[str], *, width: int = WIDTH, height: int = HEIGHT, engine: str = "tesseract") -> dict:
    """A pod's answer with a box for each line, one under the other."""
    return {
        "text": "\n".join(lines),
        "lines": [
            {"text": text, "bbox": [50, 40 + 60 * i, 50 + 20 * len(text), 80 + 60 * i], "confidence": 90.0}
            for i, text in enumerate(lines)
        ],  # fmt: skip
        "confidence": 90.0,
        "width": width,
        "height": height,
        "engine": engine,
    }


def built_pdf(job: Job, position: int = 0) -> bytes:
    document = job.documents.get(position=position)
    row = searchable_pdf_build(document_id=document.pk)
    assert row.status == SearchablePdf.Status.BUILT, row.error
    from ocrjobs.storage import document_bytes

    return document_bytes(row.name)


def text_of(pdf: bytes) -> list[str]:
    document = pdfium.PdfDocument(pdf)
    return [document[i].get_textpage().get_text_bounded().replace("\r\n", "\n") for i in range(len(document))]


def sizes_of(pdf: bytes) -> list[tuple[float, float]]:
    document = pdfium.PdfDocument(pdf)
    return [tuple(round(v, 2) for v in document[i].get_size()) for i in range(len(document))]


def render_modes(pdf: bytes) -> set[int]:
    """The text render modes used wherever text is shown in the PDF's pages and their forms."""
    modes, seen = set(), set()
    with pikepdf.open(io.BytesIO(pdf)) as doc:

        def walk(obj) -> None:
            if obj.objgen in seen:
                return
            seen.add(obj.objgen)
            mode = 0
            for operands, operator in pikepdf.parse_content_stream(obj):
                if str(operator) == "Tr":
                    mode = int(operands[0])
                elif str(operator) in ("Tj", "TJ", "'", '"'):
                    modes.add(mode)
            for xobject in obj.get("/Resources", {}).get("/XObject", {}).values():
                if xobject.get("/Subtype") == "/Form":
                    walk(xobject)

        for page in doc.pages:
            walk(page.obj)
    return modes


@pytest.fixture
def own_pdf_job(ordinary_user, local_pool) -> Job:
    job = submit(ordinary_user, {"report.pdf": pdf_bytes(PAGES_TRUTH[:2])}, searchable_pdf=True)
    split(job)
    complete_all(
        job,
        results={(0, 1): boxed(["Water levels rose", "in March 中文 Größe"]), (0, 2): boxed(["Three pumps serviced"])},
    )
    return job


# --- the searchable PDF ----------------------------------------------------------------------------


def test_the_searchable_pdf_has_the_originals_pages_and_the_text_in_reading_order(own_pdf_job):
    original = pdf_bytes(PAGES_TRUTH[:2])

    pdf = built_pdf(own_pdf_job)

    assert sizes_of(pdf) == sizes_of(original)
    assert text_of(pdf) == ["Water levels rose\nin March 中文 Größe", "Three pumps serviced"]
    assert render_modes(pdf) == {3}  # invisible: never drawn, only found


def test_each_line_is_placed_over_its_box(own_pdf_job):
    pdf = pdfium.PdfDocument(built_pdf(own_pdf_job))
    page = pdf[0]
    page_width, page_height = page.get_size()
    textpage = page.get_textpage()
    left, bottom, right, top = textpage.get_charbox(0)  # the W of "Water", boxed at x 50, y 40..80 of 1000x500

    assert left == pytest.approx(50 * page_width / WIDTH, abs=3)
    assert page_height - top == pytest.approx(40 * page_height / HEIGHT, abs=6)
    assert page_height - bottom <= 80 * page_height / HEIGHT + 3


def test_an_image_document_becomes_a_page_at_its_dpi(ordinary_user, local_pool):
    buffer = io.BytesIO()
    Image.new("L", (WIDTH, HEIGHT), 255).save(buffer, format="PNG", dpi=(200, 200))
    job = submit(ordinary_user, {"scan.png": buffer.getvalue()})
    split(job)
    complete_all(job, results={(0, 1): boxed(["a scanned line"])})

    pdf = built_pdf(job)

    assert sizes_of(pdf) == [(WIDTH * 72 / 200, HEIGHT * 72 / 200)]
    assert text_of(pdf) == ["a scanned line"]
    with pikepdf.open(io.BytesIO(pdf)) as doc:
        assert len(list(doc.pages[0].get_images())) == 1


def text_layer_pdf(lines: list[str]) -> bytes:
    buffer = io.BytesIO()
    page = canvas.Canvas(buffer, pagesize=(612, 792))
    for i, line in enumerate(lines):
        page.drawString(72, 700 - 20 * i, line)
    page.showPage()
    page.save()
    return buffer.getvalue()


def test_a_page_that_had_a_text_layer_keeps_it_as_it_was(ordinary_user, local_pool):
    original = text_layer_pdf(["This page was born digital and has its own text.", "A second line of it."])
    job = submit(ordinary_user, {"digital.pdf": original}, skip_text_pages=True)
    split(job)
    job_refresh(job_id=job.pk)
    assert job.pages.get().read_result()["source"] == "text layer"

    pdf = built_pdf(job)

    assert text_of(pdf) == text_of(original)  # no second copy of the text over it
    with pikepdf.open(io.BytesIO(pdf)) as built, pikepdf.open(io.BytesIO(original)) as before:
        assert built.pages[0].obj.Contents.read_bytes() == before.pages[0].obj.Contents.read_bytes()


def test_building_twice_keeps_one_file(own_pdf_job, django_capture_on_commit_callbacks):
    document = own_pdf_job.documents.get()
    with django_capture_on_commit_callbacks(execute=True):
        first = searchable_pdf_build(document_id=document.pk).name
        second = searchable_pdf_build(document_id=document.pk)

    assert second.builds == 2 and second.status == SearchablePdf.Status.BUILT
    folder = Path(documents().path(second.name)).parent
    assert sorted(p.name for p in folder.iterdir()) == [Path(second.name).name] and first != second.name


def test_a_failed_build_is_shown_and_the_job_stays_as_it_was(own_pdf_job, client, submit_token):
    document = own_pdf_job.documents.get()
    from ocrjobs.storage import document_delete

    document_delete(document.source)

    row = searchable_pdf_build(document_id=document.pk)

    assert row.status == SearchablePdf.Status.FAILED and "Error" in row.error
    own_pdf_job.refresh_from_db()
    assert own_pdf_job.status == Job.Status.DONE
    response = client.get(f"/v1/jobs/{own_pdf_job.pk}/documents/{document.pk}/result.pdf", headers=auth(submit_token))
    assert response.status_code == 409
    assert "could not be built" in response.json()["error"]


def test_the_job_ending_asks_the_outputs_workers_for_the_pdfs_it_asked_for(
    ordinary_user, local_pool, queued, django_capture_on_commit_callbacks
):
    job = submit(ordinary_user, {"report.pdf": pdf_bytes(PAGES_TRUTH[:1])}, searchable_pdf=True)
    with django_capture_on_commit_callbacks(execute=True):
        split(job)
        complete_all(job, results={(0, 1): boxed(["one line"])})

    assert "ocrjobs.output_tasks.request_searchable_pdfs" in queued(OUTPUTS)
    assert SearchablePdf.objects.get().status == SearchablePdf.Status.PENDING
    request_searchable_pdfs([job.pk])  # as the worker runs it: a build task for its documents
    assert queued(OUTPUTS).count("ocrjobs.output_tasks.build_searchable_pdfs") == 1
    assert not any("output_tasks" in task for task in queued(SHORT))  # never where splits wait


def test_a_job_that_did_not_ask_for_pdfs_builds_none_as_it_ends(
    ordinary_user, local_pool, queued, django_capture_on_commit_callbacks
):
    job = submit(ordinary_user, {"report.pdf": pdf_bytes(PAGES_TRUTH[:1])})
    with django_capture_on_commit_callbacks(execute=True):
        split(job)
        complete_all(job, results={(0, 1): boxed(["one line"])})

    job.refresh_from_db()
    assert job.status == Job.Status.DONE and not job.searchable_pdf
    assert not SearchablePdf.objects.exists()
    assert not any("output_tasks" in task for task in queued(SHORT) + queued(OUTPUTS))


def test_the_first_download_of_a_pdf_not_asked_for_builds_it(
    ordinary_user, local_pool, client, submit_token, queued, django_capture_on_commit_callbacks
):
    job = submit(ordinary_user, {"report.pdf": pdf_bytes(PAGES_TRUTH[:1])})
    split(job)
    complete_all(job, results={(0, 1): boxed(["asked for later"])})
    document = job.documents.get()
    url = f"/v1/jobs/{job.pk}/documents/{document.pk}/result.pdf"
    outputs_before = client.get(f"/v1/jobs/{job.pk}", headers=auth(submit_token)).json()["documents"][0]["outputs"]

    with django_capture_on_commit_callbacks(execute=True):
        first = client.get(url, headers=auth(submit_token))
    again = client.get(url, headers=auth(submit_token))

    assert outputs_before["pdf"] == {"state": "on_request", "url": url}
    assert first.status_code == 202 and first["Retry-After"] and "being built" in first.json()["message"]
    assert again.status_code == 202  # one build asked for, however often the download is tried
    assert queued(OUTPUTS) == ["ocrjobs.output_tasks.request_searchable_pdfs"]
    request_searchable_pdfs([job.pk])
    searchable_pdf_build(document_id=document.pk)
    built = client.get(url, headers=auth(submit_token))
    assert built.status_code == 200 and text_of(b"".join(built.streaming_content)) == ["asked for later"]


def test_only_the_owners_download_asks_for_a_pdf_not_asked_for(
    ordinary_user, local_pool, client, admin_token, submit_token
):
    job = submit(ordinary_user, {"report.pdf": pdf_bytes(PAGES_TRUTH[:1])})
    document = job.documents.get()
    url = f"/v1/jobs/{job.pk}/documents/{document.pk}/result.pdf"
    running = client.get(url, headers=auth(submit_token))
    split(job)
    complete_all(job, results={(0, 1): boxed(["mine"])})

    staff = client.get(url, headers=auth(admin_token))

    assert running.status_code == 409 and "once job" in running.json()["error"]
    assert staff.status_code == 409 and "only its owner" in staff.json()["error"]
    assert not SearchablePdf.objects.exists()


def test_a_retried_job_rebuilds_only_the_pdfs_asked_for(ordinary_user, local_pool, django_capture_on_commit_callbacks):
    job = submit(ordinary_user, {"a.pdf": pdf_bytes(PAGES_TRUTH[:1]), "b.pdf": pdf_bytes(PAGES_TRUTH[:1])})
    split(job)
    complete_all(job, results={(0, 1): boxed(["a"]), (1, 1): boxed(["b"])})
    first = job.documents.get(position=0)
    with django_capture_on_commit_callbacks(execute=False):
        assert document_pdf_request(document=first)
    searchable_pdf_build(document_id=first.pk)
    Job.objects.filter(pk=job.pk).update(status=Job.Status.RUNNING, finished_at=None)

    with django_capture_on_commit_callbacks(execute=False):
        job_refresh(job_id=job.pk)

    assert list(SearchablePdf.objects.values_list("document_id", "status")) == [
        (first.pk, SearchablePdf.Status.PENDING)
    ]


def test_a_job_that_ends_again_has_its_pdf_built_again(own_pdf_job, django_capture_on_commit_callbacks):
    document = own_pdf_job.documents.get()
    searchable_pdf_build(document_id=document.pk)
    Job.objects.filter(pk=own_pdf_job.pk).update(status=Job.Status.RUNNING, finished_at=None)

    with django_capture_on_commit_callbacks(execute=False):
        job_refresh(job_id=own_pdf_job.pk)

    assert SearchablePdf.objects.get(pk=document.pk).status == SearchablePdf.Status.PENDING


# --- Markdown ----------------------------------------------------------------------------------


@pytest.mark.parametrize("engine", ["vlm", "scribe"])
def test_markdown_keeps_as_written_the_text_of_any_engine_whose_answer_says_it_is_markdown(engine):
    text = "# Title\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n$x^2$\n"
    written = StoredResult.from_dict({"engine": engine, "markdown": True, "text": text})
    assert page_markdown(written) == text.strip("\n")


def test_markdown_escapes_the_text_of_an_engine_whose_answer_does_not_say_it_is_markdown():
    text = "# not a heading\nsame paragraph *x*\n\n1. not a list\n- nor this"
    escaped = "\\# not a heading same paragraph \\*x\\*\n\n1\\. not a list - nor this"
    assert page_markdown(StoredResult.from_dict({"engine": "tesseract", "text": text})) == escaped
    assert page_markdown(StoredResult.from_dict({"engine": "vlm", "markdown": False, "text": text})) == escaped


# --- downloads -------------------------------------------------------------------------------------


def test_each_documents_downloads(client, submit_token, own_pdf_job):
    document = own_pdf_job.documents.get()
    searchable_pdf_build(document_id=document.pk)
    base = f"/v1/jobs/{own_pdf_job.pk}/documents/{document.pk}"

    txt = client.get(f"{base}/result.txt", headers=auth(submit_token))
    md = client.get(f"{base}/result.md", headers=auth(submit_token))
    jsonl = client.get(f"{base}/result.jsonl", headers=auth(submit_token))
    pdf = client.get(f"{base}/result.pdf", headers=auth(submit_token))
    job_md = client.get(f"/v1/jobs/{own_pdf_job.pk}/result.md", headers=auth(submit_token))

    assert [r.status_code for r in (txt, md, jsonl, pdf, job_md)] == [200] * 5
    assert b"".join(txt.streaming_content).decode() == "Water levels rose\nin March 中文 Größe\fThree pumps serviced"
    assert "<!-- page 2 -->\n\nThree pumps serviced" in b"".join(md.streaming_content).decode()
    assert [json.loads(line)["page"] for line in b"".join(jsonl.streaming_content).splitlines()] == [1, 2]
    assert (
        pdf["Content-Type"] == "application/pdf"
        and pdf["Content-Disposition"] == 'attachment; filename="report.ocr.pdf"'
    )
    assert text_of(b"".join(pdf.streaming_content))[1] == "Three pumps serviced"
    assert b"".join(job_md.streaming_content).decode().startswith("# report.pdf\n\n<!-- page 1 -->")


@pytest.mark.parametrize(
    ("path", "name"),
    [("result.txt", "job-{job}.txt"), ("result.md", "job-{job}.md"), ("result.jsonl", "job-{job}.jsonl"),
     ("documents/{document}/result.txt", "report.txt"), ("documents/{document}/result.md", "report.md"),
     ("documents/{document}/result.jsonl", "report.jsonl")],
)  # fmt: skip
def test_every_text_download_is_a_file_the_browser_saves(client, submit_token, own_pdf_job, path, name):
    # A job's downloads opened in the tab while a document's were saved (UI review item 8).
    document = own_pdf_job.documents.get()

    response = client.get(f"/v1/jobs/{own_pdf_job.pk}/" + path.format(document=document.pk), headers=auth(submit_token))

    assert response["Content-Disposition"] == f'attachment; filename="{name.format(job=own_pdf_job.pk)}"'


def test_the_pdf_is_202_until_it_is_built(client, submit_token, own_pdf_job):
    document = own_pdf_job.documents.get()
    response = client.get(f"/v1/jobs/{own_pdf_job.pk}/documents/{document.pk}/result.pdf", headers=auth(submit_token))

    assert response.status_code == 202 and response["Retry-After"] == "5"
    assert response.json()["state"] == "building" and "is being built" in response.json()["message"]


def test_the_zip_streams_in_parts_and_holds_every_output(client, submit_token, own_pdf_job, monkeypatch):
    document = own_pdf_job.documents.get()
    searchable_pdf_build(document_id=document.pk)
    monkeypatch.setattr(downloads, "CHUNK_BYTES", 1024)
    monkeypatch.setattr("ocrjobs.storage.CHUNK", 4096)  # the PDF read from storage in parts

    response = client.get(f"/v1/jobs/{own_pdf_job.pk}/outputs.zip", headers=auth(submit_token))

    assert response.status_code == 200 and response.streaming
    parts = list(response.streaming_content)
    assert len(parts) > 3  # sent as it is written, not made whole first
    archive = zipfile.ZipFile(io.BytesIO(b"".join(parts)))
    assert sorted(archive.namelist()) == [
        "documents/report.alto.xml", "documents/report.hocr", "documents/report.jsonl", "documents/report.md",
        "documents/report.ocr.pdf", "documents/report.txt", "result.jsonl", "result.md", "result.txt",
    ]  # fmt: skip
    assert archive.read("documents/report.txt").decode().endswith("Three pumps serviced")
    assert text_of(archive.read("documents/report.ocr.pdf"))[0].startswith("Water levels rose")


@pytest.mark.parametrize("path", ["outputs.zip", "result.md", "documents/{document}/result.pdf"])
def test_under_asgi_a_download_streams_chunk_by_chunk(submit_token, own_pdf_job, monkeypatch, path):
    # Django reads a synchronous iterator whole into memory under ASGI; a download must not be one.
    from asgiref.sync import async_to_sync
    from django.test import AsyncClient

    document = own_pdf_job.documents.get()
    searchable_pdf_build(document_id=document.pk)
    monkeypatch.setattr(downloads, "CHUNK_BYTES", 64)
    monkeypatch.setattr("ocrjobs.storage.CHUNK", 4096)
    url = f"/v1/jobs/{own_pdf_job.pk}/" + path.format(document=document.pk)

    async def download():
        response = await AsyncClient().get(url, headers=auth(submit_token))
        return response.status_code, response.is_async, [chunk async for chunk in response.streaming_content]

    status, is_async, chunks = async_to_sync(download)()

    assert status == 200 and is_async
    assert len(chunks) > 1


def test_the_zip_is_written_as_it_is_read(own_pdf_job):
    """Members are generators: the first bytes come out before any document is read."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    archive = downloads.job_zip(own_pdf_job)
    with CaptureQueriesContext(connection) as queries:
        first = next(iter(archive))
    assert first and len(queries) <= 3  # the job's first member started, the documents not yet read


@pytest.mark.parametrize(
    "path",
    ["result.md", "outputs.zip", "documents/{document}/result.txt", "documents/{document}/result.md",
     "documents/{document}/result.jsonl", "documents/{document}/result.pdf", "documents/{document}/result.hocr",
     "documents/{document}/result.alto.xml"],
)  # fmt: skip
def test_downloads_are_401_without_a_token_and_404_for_someone_elses_job(client, outsider, own_pdf_job, path):
    url = f"/v1/jobs/{own_pdf_job.pk}/" + path.format(document=own_pdf_job.documents.get().pk)
    other = ApiToken.issue(user=outsider, name="t", scopes=["read"])[1]

    anonymous = client.get(url)
    outsider_response = client.get(url, headers=auth(other))

    assert anonymous.status_code == 401 and "error" in anonymous.json()
    assert outsider_response.status_code == 404 and "error" in outsider_response.json()


def test_a_document_of_another_job_is_404(client, submit_token, ordinary_user, own_pdf_job):
    other = submit(ordinary_user, {"other.pdf": pdf_bytes(PAGES_TRUTH[:1])})
    url = f"/v1/jobs/{own_pdf_job.pk}/documents/{other.documents.get().pk}/result.txt"

    response = client.get(url, headers=auth(submit_token))

    assert response.status_code == 404
    assert response.json() == {"error": f"job {own_pdf_job.pk} has no document {other.documents.get().pk}"}


def test_the_job_names_its_downloads(client, submit_token, own_pdf_job):
    urls = client.get(f"/v1/jobs/{own_pdf_job.pk}", headers=auth(submit_token)).json()["urls"]

    assert urls["result_md"] == f"/v1/jobs/{own_pdf_job.pk}/result.md"
    assert urls["outputs_zip"] == f"/v1/jobs/{own_pdf_job.pk}/outputs.zip"


def test_the_openapi_describes_the_downloads(client, read_token):
    paths = client.get("/v1/openapi.json", headers=auth(read_token)).json()["paths"]

    assert paths["/v1/jobs/{job_id}/outputs.zip"]["get"]["responses"]["200"]["content"] == {"application/zip": {}}
    description = paths["/v1/jobs/{job_id}/documents/{document_id}/result.pdf"]["get"]["description"]
    assert "202" in description and "409" in description and "first download" in description
    for suffix in ("txt", "md", "jsonl", "hocr", "alto.xml"):
        assert f"/v1/jobs/{{job_id}}/documents/{{document_id}}/result.{suffix}" in paths


def test_the_job_page_links_the_downloads(client, ordinary_user, own_pdf_job):
    document = own_pdf_job.documents.get()
    searchable_pdf_build(document_id=document.pk)
    client.force_login(ordinary_user)

    page = client.get(f"/jobs/{own_pdf_job.pk}").content.decode()

    assert f"/v1/jobs/{own_pdf_job.pk}/outputs.zip" in page
    assert f"/v1/jobs/{own_pdf_job.pk}/documents/{document.pk}/result.pdf" in page
    assert f"/v1/jobs/{own_pdf_job.pk}/documents/{document.pk}/result.md" in page
    assert f"/v1/jobs/{own_pdf_job.pk}/documents/{document.pk}/result.hocr" in page
    assert f"/v1/jobs/{own_pdf_job.pk}/documents/{document.pk}/result.alto.xml" in page


# --- with a real engine ------------------------------------------------------------------------


def test_tesseract_read_pages_come_back_searchable_with_the_same_text(ordinary_user, local_pool, tmp_path):
    """The pages rendered as a pod renders them, read by tesseract, the PDF built from its answers:
    what pdfium extracts is result.txt's text (issue 25's goal: >= 99% of its characters)."""
    import difflib

    from podserver.engines.tesseract import TesseractEngine
    from podserver.pages import render_page

    original = pdf_bytes(PAGES_TRUTH[:2])
    (tmp_path / "scan.pdf").write_bytes(original)
    engine = TesseractEngine()
    engine.load()
    results = {(0, n): engine.ocr(render_page(tmp_path / "scan.pdf", n, 200), "eng", 60) for n in (1, 2)}
    job = submit(ordinary_user, {"scan.pdf": original})
    split(job)
    complete_all(job, results=results)

    pdf = built_pdf(job)

    assert sizes_of(pdf) == sizes_of(original)
    for number, extracted in enumerate(text_of(pdf), start=1):
        expected = "\n".join(line["text"] for line in results[(0, number)]["lines"])
        assert difflib.SequenceMatcher(None, extracted, expected).ratio() >= 0.99, (extracted, expected)
        assert "Water levels" in extracted or "maintenance work" in extracted


# --- manage.py ocr --format ------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_the_command_writes_the_formats_asked_for(local_pool, tmp_path):
    from django.db import connection

    from tests.ocrjobs.test_ocr_command import HANG_GUARD, Workers, run_ocr

    class Builders(Workers):
        def run(self) -> None:
            super().run()
            try:
                for document_id in Job.objects.get().documents.values_list("pk", flat=True):
                    searchable_pdf_build(document_id=document_id)
            finally:
                connection.close()

    report = tmp_path / "report.pdf"
    report.write_bytes(pdf_bytes(PAGES_TRUTH[:1]))
    workers = Builders(texts={(0, 1): "first page"})
    workers.start()

    code, stderr = run_ocr(str(report), "--out", str(tmp_path / "out"), "--format", "txt,md,pdf,hocr,alto",
                           "--timeout", str(HANG_GUARD))  # fmt: skip
    workers.join(HANG_GUARD)

    assert workers.error is None
    assert code == 0, stderr
    out = tmp_path / "out"
    assert sorted(p.name for p in out.iterdir()) == ["report.alto.xml", "report.hocr", "report.md", "report.pdf",
                                                     "report.txt"]  # fmt: skip
    assert (out / "report.md").read_text() == "<!-- page 1 -->\n\nfirst page\n"
    assert (
        "ocrx_word" in (out / "report.hocr").read_text() and 'CONTENT="first"' in (out / "report.alto.xml").read_text()
    )
    assert len(text_of((out / "report.pdf").read_bytes())) == 1


def test_the_command_refuses_an_unknown_format_before_submitting(local_pool, tmp_path):
    from tests.ocrjobs.test_ocr_command import run_ocr

    report = tmp_path / "report.pdf"
    report.write_bytes(pdf_bytes(PAGES_TRUTH[:1]))

    code, stderr = run_ocr(str(report), "--format", "txt,docx")

    assert code == 2 and "--format takes txt, md, pdf, jsonl" in stderr
    assert not Job.objects.exists()


def image_sizes(pdf: bytes) -> list[tuple[int, int]]:
    with pikepdf.open(io.BytesIO(pdf)) as doc:
        return [(int(image.Width), int(image.Height)) for page in doc.pages for image in page.get_images().values()]


def test_frames_are_drawn_at_the_size_the_pod_read_them_never_larger(ordinary_user, local_pool):
    """Review N2: the build draws each frame at the pixels the pod read (its result's width and
    height), not the file's (a 100-megapixel frame was 3.8 s and 1.3 GB); and never above the file's."""
    job = submit(ordinary_user, {"scan.tif": tiff_bytes([(2000, 1000), (2000, 1000)])})
    split(job)
    complete_all(job, results={(0, 1): boxed(["read small"], width=500, height=250),
                               (0, 2): boxed(["read large"], width=4000, height=2000)})  # fmt: skip

    pdf = built_pdf(job)

    assert image_sizes(pdf) == [(500, 250), (2000, 1000)]
    assert text_of(pdf) == ["read small", "read large"]
    assert sizes_of(pdf)[0] == sizes_of(pdf)[1]  # the page keeps its size: only its pixels are fewer


def test_a_frame_no_pod_read_is_drawn_at_the_unread_frame_pixels_at_most(ordinary_user, local_pool):
    job = submit(ordinary_user, {"scan.tif": tiff_bytes([(3000, 2000), (100, 50)])})
    split(job)
    complete_all(job, results={(0, 1): boxed(["lost"]), (0, 2): boxed(["the second"], width=100, height=50)})
    job.pages.filter(number=1).update(status=Page.Status.FAILED)

    (first, second) = image_sizes(built_pdf(job))

    assert first[0] * first[1] <= searchable_pdf.UNREAD_FRAME_PIXELS and first[0] / first[1] == pytest.approx(1.5, 0.01)
    assert second == (100, 50)
