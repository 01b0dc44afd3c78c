"""PDFs that already carry text (issue 40, item 3), made here: a scan with an earlier OCR's
invisible layer, a page of visible text whose font's ToUnicode map is broken (it extracts as
"䴀甀氀琀椀"), and a page of visible vector text."""

from __future__ import annotations

import io

import pikepdf
from reportlab.lib.utils import ImageReader
from reportlab.pdfgen import canvas

from tests.factories import render_page

PAGE = (612.0, 792.0)


def _drawn(draw) -> bytes:
    buffer = io.BytesIO()
    page_canvas = canvas.Canvas(buffer, pagesize=PAGE, invariant=1)
    draw(page_canvas)
    page_canvas.showPage()
    page_canvas.save()
    return buffer.getvalue()


def _text(page_canvas: canvas.Canvas, lines: list[str], *, mode: int, top: float = 700, points: float = 14) -> None:
    text = page_canvas.beginText(72, top)
    text.setFont("Helvetica", points)
    text.setTextRenderMode(mode)
    text.setLeading(points * 2)
    for line in lines:
        text.textLine(line)
    page_canvas.drawText(text)


def pretexted_pdf(lines: list[str], old_layer: list[str] | None = None) -> bytes:
    """A scan of ``lines`` (an image) under an earlier OCR's invisible text (render mode 3):
    ``old_layer``, the same lines by default."""

    def draw(page_canvas):
        page_canvas.drawImage(ImageReader(render_page(lines)), 0, 0, width=PAGE[0], height=PAGE[1])
        _text(page_canvas, old_layer if old_layer is not None else lines, mode=3)

    return _drawn(draw)


def vector_text_pdf(lines: list[str]) -> bytes:
    """A born-digital page: ``lines`` as visible text."""
    return _drawn(lambda page_canvas: _text(page_canvas, lines, mode=0))


def broken_font_pdf(lines: list[str]) -> bytes:
    """``lines`` as visible Helvetica, drawn right, whose ToUnicode maps each code to the code
    shifted into the high byte: what a reader extracts is "䴀甀氀琀椀", not "Multi"."""
    pdf = pikepdf.open(io.BytesIO(vector_text_pdf(lines)))
    pairs = "\n".join(f"<{code:02X}> <{code:02X}00>" for code in range(0x20, 0x7F))
    cmap = (
        "/CIDInit /ProcSet findresource begin 12 dict begin begincmap /CMapName /Broken def "
        f"1 begincodespacerange <00> <FF> endcodespacerange 95 beginbfchar\n{pairs}\nendbfchar "
        "endcmap CMapName currentdict /CMap defineresource pop end end"
    )
    for font in pdf.pages[0].Resources.Font.values():
        font.ToUnicode = pdf.make_stream(cmap.encode())
    out = io.BytesIO()
    pdf.save(out, deterministic_id=True)
    return out.getvalue()
