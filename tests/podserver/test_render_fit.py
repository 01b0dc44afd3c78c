"""A PDF page too large to render at the DPI asked for is rendered at the largest DPI under the
pod's pixel limit and read, with a warning, not refused (issue 40: a poster page was refused 413)."""

from __future__ import annotations

import hashlib
import io
from pathlib import Path

import httpx
import pypdfium2 as pdfium
import pytest

from podserver import pages
from tests.factories import PAGES_TRUTH, accuracy, pdf_bytes

pytestmark = pytest.mark.once_sqlite


def test_the_fitting_dpi_is_the_largest_under_the_limit(monkeypatch) -> None:
    monkeypatch.setattr(pages, "MAX_PIXELS", 1_000_000)

    assert pages.fitting_dpi(612, 792, 100) == 100  # 850 × 1100: under the limit as asked
    fitted = pages.fitting_dpi(612, 792, 200)
    assert pages.pixels_at(612, 792, fitted) <= 1_000_000 < pages.pixels_at(612, 792, fitted + 1)
    assert pages.fitting_dpi(14_400, 14_400, 600) == 5  # 200 inches square: 1000 × 1000 pixels


def test_a_page_over_the_limit_renders_at_the_dpi_that_fits(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "letter.pdf"
    path.write_bytes(pdf_bytes(PAGES_TRUTH[:1]))
    monkeypatch.setattr(pages, "MAX_PIXELS", 2_000_000)

    img = pages.render_pdf_page(path, 1, 200)

    assert img.width * img.height <= 2_000_000
    assert img.info[pages.RENDER_DPI] == pages.fitting_dpi(612, 792, 200) < 200


def test_the_pod_reads_it_and_says_it_was_rendered_below_its_dpi(start_server, monkeypatch) -> None:
    srv, url = start_server()
    data = pdf_bytes(PAGES_TRUTH[:1])
    # The pod's renderer runs in child processes: here the page renders in the test's process,
    # where the lowered limit holds.
    monkeypatch.setattr(pages, "MAX_PIXELS", 4_000_000)
    monkeypatch.setattr(srv, "render", lambda path, number, dpi: pages.render_pdf_page(path, number, dpi))
    sha = hashlib.sha256(data).hexdigest()
    assert httpx.put(f"{url}/v1/documents/{sha}", content=data, timeout=30).status_code == 201

    body = httpx.post(f"{url}/v1/ocr", json={"document": sha, "page": 1, "dpi": 300}, timeout=60).json()

    fitted = pages.fitting_dpi(612, 792, 300)
    assert body["dpi"] == fitted < 300 and body["width"] * body["height"] <= 4_000_000
    assert accuracy(body["text"], " ".join(PAGES_TRUTH[0])) >= 0.95
    assert body["warnings"] == [
        f"rendered at {fitted} DPI, not 300: at 300 DPI the page would be over the limit of 4 megapixels"
    ]


def test_a_page_under_the_limit_renders_at_the_dpi_asked_with_no_warning(start_server) -> None:
    _, url = start_server()
    document = pdfium.PdfDocument.new()
    document.new_page(200, 100)
    buffer = io.BytesIO()
    document.save(buffer)
    data = buffer.getvalue()
    sha = hashlib.sha256(data).hexdigest()
    httpx.put(f"{url}/v1/documents/{sha}", content=data, timeout=30)

    body = httpx.post(f"{url}/v1/ocr", json={"document": sha, "page": 1, "dpi": 144}, timeout=60).json()

    assert (body["dpi"], body["width"], body["height"], body["warnings"]) == (144, 400, 200, [])
