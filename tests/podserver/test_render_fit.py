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


# --- a small page holding a fine scan (issue 40 item 4) ------------------------------------------

TINY_LINE = "The survey ends here"


def _tiny_scan():
    """A line of text on a strip 1,700 × 150 pixels, at 2,400 DPI a page 0.7 inch by 0.06: 142 × 13
    pixels at 200 DPI, where tesseract reads nothing."""
    from tests.factories import render_page

    return render_page([TINY_LINE], size=60, width=1800, height=300).crop((100, 150, 1800, 300))


def _scan_pdf(image, resolution: int) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PDF", resolution=resolution)
    return buffer.getvalue()


def _rendered(tmp_path: Path, data: bytes, dpi: int = 200):
    path = tmp_path / "scan.pdf"
    path.write_bytes(data)
    return pages.render_pdf_page(path, 1, dpi)


def test_a_small_page_holding_a_fine_scan_renders_at_the_scans_resolution(tmp_path: Path) -> None:
    img = _rendered(tmp_path, _scan_pdf(_tiny_scan(), 2400))

    assert img.info[pages.RENDER_DPI] == 2400 and abs(img.width - 1700) <= 1 and abs(img.height - 150) <= 1


def test_an_ordinary_scan_renders_at_the_dpi_asked_whatever_its_own(tmp_path: Path) -> None:
    from PIL import Image

    letter_at_300 = Image.new("L", (2550, 3300), 255)
    img = _rendered(tmp_path, _scan_pdf(letter_at_300, 300))

    # A Letter page never costs more pixels than at the DPI asked: 300 DPI would be 2.25 times as many.
    assert img.info[pages.RENDER_DPI] == 200 and img.size == (1700, 2200)


def test_a_fine_scan_raises_a_small_page_only_as_far_as_a_letter_pages_pixels(tmp_path: Path) -> None:
    from PIL import Image

    # Two inches square at 6,000 DPI: at its own resolution 144 megapixels, over a Letter page's 3.74.
    img = _rendered(tmp_path, _scan_pdf(Image.new("L", (12000, 12000), 255), 6000))

    assert 200 < img.info[pages.RENDER_DPI] < 6000
    assert img.width * img.height <= 8.5 * 11 * 200 * 200


def test_a_small_image_on_a_page_does_not_raise_its_dpi(tmp_path: Path) -> None:
    document = pdfium.PdfDocument.new()
    page = document.new_page(612, 792)
    logo = pdfium.PdfImage.new(document)
    logo.set_bitmap(pdfium.PdfBitmap.from_pil(__import__("PIL.Image").Image.new("L", (600, 600), 0)))
    logo.set_matrix(pdfium.PdfMatrix().scale(72, 72).translate(72, 648))  # one inch: 600 DPI, 1% of the page
    page.insert_obj(logo)
    page.gen_content()
    buffer = io.BytesIO()
    document.save(buffer)

    assert _rendered(tmp_path, buffer.getvalue()).info[pages.RENDER_DPI] == 200


def test_the_pod_reads_a_small_page_that_200_dpi_would_leave_unreadable(start_server, monkeypatch) -> None:
    srv, url = start_server()
    monkeypatch.setattr(srv, "render", lambda path, number, dpi: pages.render_pdf_page(path, number, dpi))
    data = _scan_pdf(_tiny_scan(), 2400)
    sha = hashlib.sha256(data).hexdigest()
    assert httpx.put(f"{url}/v1/documents/{sha}", content=data, timeout=30).status_code == 201

    body = httpx.post(f"{url}/v1/ocr", json={"document": sha, "page": 1, "dpi": 200}, timeout=60).json()

    assert body["dpi"] == 2400 and body["warnings"] == []
    assert accuracy(body["text"], TINY_LINE) >= 0.9
