"""The job page's page viewer in a real browser (Debian's chromium driven by Playwright): pdf.js
draws a real PDF's page, a PNG is shown as it is, each line read by the real tesseract engine is
boxed over the words, and a line is highlighted in the page and in the text together."""

from __future__ import annotations

import io
import json
import re
import uuid

import pytest
from django.conf import settings as django_settings
from PIL import Image

from ocrjobs import viewer_views
from ocrjobs.models import Page
from ocrjobs.services.jobs import job_refresh
from ocrjobs.services.pages import page_complete, pages_claim
from ocrjobs.storage import document_local
from podserver.engines.tesseract import TesseractEngine
from podserver.pages import render_page
from tests.e2e.test_browser import closing_its_connections
from tests.factories import image_bytes, pdf_bytes
from tests.ocrjobs.helpers import split, submit

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.once_sqlite,  # the browser, not the database
]

DPI = 200
SHORT_MS = 30_000
# What share of a box's pixels on the drawn page are dark: the words are inside it.
INK = """([article, line]) => {
    const canvas = document.querySelector(`#${article} canvas`);
    const box = document.querySelector(`#${article} .box[data-line="${line}"]`);
    const sheet = canvas.getBoundingClientRect(), rect = box.getBoundingClientRect();
    const sx = canvas.width / sheet.width, sy = canvas.height / sheet.height;
    const data = canvas.getContext("2d").getImageData((rect.left - sheet.left) * sx, (rect.top - sheet.top) * sy,
                                                      rect.width * sx, rect.height * sy).data;
    let dark = 0;
    for (let i = 0; i < data.length; i += 4) if (data[i] + data[i + 1] + data[i + 2] < 384) dark++;
    return dark / (data.length / 4);
}"""


def vlm_page(job, markdown: str) -> None:
    """The job's one page read by a vlm engine whose answer is ``markdown``."""
    lines = [{"text": markdown, "bbox": None, "confidence": 91.0}]
    result = {
        "text": markdown,
        "lines": lines,
        "confidence": 91.0,
        "width": 1700,
        "height": 100,
        "engine": "vlm",
        "markdown": True,
    }  # as a vlm pod answers (it gives Markdown)
    token = uuid.uuid4().hex
    [claim] = pages_claim(pool_id=job.pool_id, token=token, limit=10)
    assert page_complete(page_id=claim.id, token=token, pod_id=None, result=result)
    job_refresh(job_id=job.pk)


def read_every_page(job) -> None:
    """Each page read by the tesseract engine as a pod reads it (a PDF page rendered at DPI)."""
    engine = TesseractEngine()
    engine.load()
    token = uuid.uuid4().hex
    claimed = pages_claim(pool_id=job.pool_id, token=token, limit=100)
    for claim in claimed:
        page = Page.objects.select_related("document").get(pk=claim.id)
        with document_local(page.document.source) as path:
            img = render_page(path, page.number, DPI)
        result = engine.ocr(img, "eng", 60)
        if page.document.kind == "pdf":
            result["dpi"] = DPI
        assert page_complete(page_id=claim.id, token=token, pod_id=None, result=result)
    job_refresh(job_id=job.pk)


def with_lines_at(page: Page, confidence: float) -> None:
    """Every line of the page's stored result read at ``confidence``, as if the engine had."""
    result = page.read_result()
    for line in result["lines"]:
        line["confidence"] = confidence
    Page.objects.filter(pk=page.pk).update(result=json.dumps(result), min_line_confidence=confidence)


def session_context(browser, client, url: str):
    """A browser context with the test client's session (logged in by force_login)."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    context.set_default_timeout(SHORT_MS)
    cookie = client.cookies[django_settings.SESSION_COOKIE_NAME].value
    context.add_cookies([{"name": django_settings.SESSION_COOKIE_NAME, "value": cookie, "url": url}])
    return context


@closing_its_connections
def test_the_viewer_boxes_each_line_over_the_drawn_page_and_highlights_it_in_both(
    live_server, client, ordinary_user, local_pool, browser, monkeypatch
):
    monkeypatch.setattr(viewer_views, "VIEWER_BATCH", 2)  # the PNG comes in the second batch
    # Playwright's sync API keeps an event loop on this thread, so Django would refuse the test's ORM calls.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    job = submit(ordinary_user, {"report.pdf": pdf_bytes(), "note.png": image_bytes(["A photographed note."])})
    split(job)
    read_every_page(job)
    client.force_login(ordinary_user)
    context = session_context(browser, client, live_server.url)
    errors: list[str] = []
    page = context.new_page()
    page.on("pageerror", lambda error: errors.append(str(error)))
    pdf_answers: list[int] = []
    page.on("response", lambda answer: "/documents/" in answer.url and pdf_answers.append(answer.status))

    pdf_page = Page.objects.get(document__name="report.pdf", number=1)
    png_page = Page.objects.get(document__name="note.png")
    page.goto(f"{live_server.url}/jobs/{job.pk}")
    article = f"viewer-page-{pdf_page.pk}"
    page.wait_for_selector(f"#{article}[data-drawn='true']")
    assert 206 in pdf_answers  # pdf.js read the PDF in ranges

    # pdf.js drew the page at the sheet's size, and tesseract's boxes sit over its words.
    boxes = page.locator(f"#{article} .box")
    assert boxes.count() == 3  # the three lines of the report's first page
    overlay = page.locator(f"#{article} .viewer-boxes").bounding_box()
    canvas = page.locator(f"#{article} canvas").bounding_box()
    assert all(abs(canvas[key] - overlay[key]) < 1 for key in ("x", "y", "width", "height")), (canvas, overlay)
    assert abs(canvas["width"] / canvas["height"] - 1700 / 2200) < 0.01
    for line in range(3):
        assert page.evaluate(INK, [article, line]) > 0.05, f"no ink under line {line}'s box"
    # A box placed where there is no text finds none: the check above can fail.
    top = page.evaluate(f"document.querySelector('#{article} .box[data-line=\"0\"]').style.top")
    page.evaluate(f"document.querySelector('#{article} .box[data-line=\"0\"]').style.top = '90%'")
    assert page.evaluate(INK, [article, 0]) < 0.01
    page.evaluate(f"document.querySelector('#{article} .box[data-line=\"0\"]').style.top = '{top}'")

    # Hovering a line's text highlights its box; clicking a box selects the line in both.
    text = page.locator(f"#{article} li[data-line='1']")
    box = page.locator(f"#{article} .box[data-line='1']")
    text.hover()
    assert "hl" in box.get_attribute("class")
    page.mouse.move(0, 0)
    assert "hl" not in box.get_attribute("class")
    page.locator(f"#{article} .box[data-line='2']").click()
    assert "selected" in page.locator(f"#{article} li[data-line='2']").get_attribute("class")
    assert page.locator(".selected").count() == 2

    # The PNG is shown as it is, its lines boxed over it, in the batch that comes as one scrolls.
    assert page.locator(".viewer-page").count() == 2
    page.locator(".viewer-more").scroll_into_view_if_needed()
    page.wait_for_selector(f"#viewer-page-{png_page.pk}")
    assert page.locator(".viewer-page").count() == 4
    image = page.locator(f"#viewer-page-{png_page.pk} .viewer-sheet img")
    image.scroll_into_view_if_needed()
    page.wait_for_function(f"() => document.querySelector('#viewer-page-{png_page.pk} img').naturalWidth > 0")
    shown = Image.open(io.BytesIO(image_bytes(["A photographed note."])))
    assert page.evaluate(f"document.querySelector('#viewer-page-{png_page.pk} img').naturalWidth") == shown.width
    page.wait_for_selector(f"#viewer-page-{png_page.pk} .box")

    # The first page, now more than a screen away, gave its pixels back; it is drawn again on return.
    page.wait_for_selector(f"#{article}[data-drawn='freed']")
    assert page.evaluate(f"document.querySelector('#{article} canvas').width") == 0
    page.locator(f"#{article}").scroll_into_view_if_needed()
    page.wait_for_selector(f"#{article}[data-drawn='true']")
    assert page.evaluate(INK, [article, 1]) > 0.05
    assert page.locator(f"#{article} .box").count() == 3  # its lines laid out once

    # A page with a line read poorly comes first, marked to check, and the filter shows it alone.
    for each in Page.objects.filter(job=job):
        with_lines_at(each, 40.0 if each.pk == png_page.pk else 95.0)
    page.goto(f"{live_server.url}/jobs/{job.pk}")
    assert page.locator(".viewer-page").first.get_attribute("id") == f"viewer-page-{png_page.pk}"
    page.click("#viewer-to-check")
    page.wait_for_url(re.compile(r"\?check=1"))
    assert page.locator(".viewer-page.to-check").count() == page.locator(".viewer-page").count() == 1
    assert errors == []
    context.close()


@closing_its_connections
def test_a_vlm_pages_markdown_is_rendered_and_what_could_run_is_dropped(
    live_server, client, ordinary_user, local_pool, browser, monkeypatch
):
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    job = submit(ordinary_user, {"table.png": image_bytes(["Pumps 4"])})
    split(job)
    markdown = (
        "# Pumps\n\nServiced **in March**.\n\n<table><tr><th>Pumps</th></tr><tr><td>4</td></tr></table>\n\n"
        '<img src="x" onerror="window.ran = true"><script>window.ran = true</script>'
    )
    vlm_page(job, markdown)
    client.force_login(ordinary_user)
    context = session_context(browser, client, live_server.url)
    page = context.new_page()

    page.goto(f"{live_server.url}/jobs/{job.pk}")
    page.wait_for_selector(".markdown.rendered")

    rendered = page.locator(".markdown.rendered")
    assert rendered.locator("h1").inner_text() == "Pumps"
    assert rendered.locator("strong").inner_text() == "in March"
    assert rendered.locator("table td").inner_text() == "4"
    assert rendered.locator("script").count() == 0
    assert rendered.locator("img").count() == 0  # no image at all (the allow-list, issue 38)
    page.wait_for_timeout(500)  # an image's error would have fired by now
    assert page.evaluate("window.ran === undefined")
    context.close()


# pdf.js's text of a PDF's pages, as its find bar searches it: each text item's string, a line
# break where pdf.js sees one.
PDFJS_TEXT = """async (encoded) => {
    const lib = await import(viewer.dataset.pdfjs);
    lib.GlobalWorkerOptions.workerSrc = viewer.dataset.pdfjsWorker;
    const data = Uint8Array.from(atob(encoded), (c) => c.charCodeAt(0));
    const doc = await lib.getDocument({data, wasmUrl: viewer.dataset.pdfjsWasm}).promise;
    const pages = [];
    for (let n = 1; n <= doc.numPages; n++) {
        const content = await (await doc.getPage(n)).getTextContent();
        pages.push(content.items.map((item) => item.str + (item.hasEOL ? "\\n" : " ")).join(""));
    }
    return pages;
}"""


@closing_its_connections
def test_a_turned_pages_boxes_sit_on_its_words_as_shown_and_pdfjs_finds_its_phrases(
    live_server, client, ordinary_user, local_pool, browser, monkeypatch
):
    # Issue 40: pages on their side and upside down, read upright by the engine, are boxed on the
    # page as the document shows it, and their searchable PDF's text layer gives pdf.js the phrases.
    import base64

    from ocrjobs.services.searchable_pdf import searchable_pdf_build
    from ocrjobs.storage import document_bytes
    from tests.ocrjobs.test_searchable_pdf_angles import pairs_found
    from tests.podserver.helpers import letter_page, page_lines

    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    lines = page_lines(6, seed=2)
    turned = [letter_page(lines).rotate(degrees, expand=True) for degrees in (90, 180)]
    buffer = io.BytesIO()
    turned[0].save(buffer, format="PDF", save_all=True, append_images=turned[1:], resolution=DPI)
    job = submit(ordinary_user, {"turned.pdf": buffer.getvalue()})
    split(job)
    read_every_page(job)
    assert [page.read_result()["rotation"] for page in job.pages.order_by("number")] == [270, 180]
    built = searchable_pdf_build(document_id=job.documents.get().pk)
    client.force_login(ordinary_user)
    context = session_context(browser, client, live_server.url)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))

    page.goto(f"{live_server.url}/jobs/{job.pk}")
    for number in (1, 2):
        article = f"viewer-page-{job.pages.get(number=number).pk}"
        page.locator(f"#{article}").scroll_into_view_if_needed()
        page.wait_for_selector(f"#{article}[data-drawn='true']")
        assert page.locator(f"#{article} .box").count() == len(lines)
        for line in range(len(lines)):
            assert page.evaluate(INK, [article, line]) > 0.05, f"page {number}: no ink under line {line}'s box"

    texts = page.evaluate(PDFJS_TEXT, base64.b64encode(document_bytes(built.name)).decode())
    assert [pairs_found(text, lines) >= 0.9 for text in texts] == [True, True], texts
    assert errors == []
    context.close()
