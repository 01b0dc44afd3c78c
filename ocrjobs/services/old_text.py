"""The text a PDF page already has, for its searchable PDF (issue 40, item 3): found in its
content streams (and the form XObjects they draw), an invisible layer (render modes 3 and 7, an
earlier OCR's) removed, and a page whose visible text must not stand drawn as an image instead.

Left beside ours, an earlier OCR's layer doubled what search and copy find (2-2.5x the OCR text)
and a broken font's mojibake stayed. What a page gets, by the job's ``text_mode`` (OCRmyPDF's
modes) and its reading (``text_layer: unusable`` when the pod found its layer mojibake):

- ``keep``: its content as it is (a page with no text; skip mode's pages the pod read);
- ``strip``: its invisible text removed, its visible text kept (redo; force when it has no
  visible text; an unusable invisible layer in any mode);
- ``raster``: drawn as an image under our layer (force, or an unusable layer, with visible text:
  the page looks as it did and extracts as our text only).

In redo, a page's visible text stays, and our lines that lie over it are left out of our layer
(``without_lines_over``): a born-digital page's text is found once, not beside our reading of it,
as OCRmyPDF's redo reads only what is not text already.
"""

from __future__ import annotations

import contextlib
import io
import logging
from dataclasses import dataclass, field

import pikepdf
import pypdfium2 as pdfium
from PIL import Image

from ocrjobs.results import StoredResult
from ocrjobs.services.pdf_update import inherited

log = logging.getLogger(__name__)

INVISIBLE_MODES = (3, 7)  # neither filled nor stroked (7: added to the clip path)
SHOWS = ("Tj", "TJ", "'", '"')
FORM_DEPTH = 8
RASTER_DPI_MAX = 300
RASTER_JPEG_QUALITY = 85
COVERED_SHARE = 0.5  # of a line's box under the page's visible text: the line is that text, read again


@dataclass
class Found:
    """A page's text: how many text-showing operators are visible and invisible, its content
    without the invisible ones (None: unchanged), and each form XObject's likewise."""

    visible: int = 0
    invisible: int = 0
    content: bytes | None = None
    forms: dict[tuple[int, int], tuple[pikepdf.Stream, bytes]] = field(default_factory=dict)


def treatment(found: Found, *, mode: str, result: StoredResult | None) -> str:
    """keep, strip or raster (the module's docstring)."""
    unusable = result is not None and result.text_layer == "unusable"
    if found.visible and (mode == "force" or unusable):
        return "raster"
    if found.invisible and (mode in ("redo", "force") or unusable):
        return "strip"
    return "keep"


def find(page: pikepdf.Page) -> Found:
    """The page's text, its content streams parsed only when they may show any. A page whose
    content qpdf cannot parse is left as it is (found empty): its layer is added as before."""
    resources = inherited(page.obj, "/Resources")
    try:
        if not _may_show_text(_content_bytes(page.obj.get("/Contents")), resources):
            return Found()
        found = Found()
        kept, found.invisible, found.visible = _without_invisible(pikepdf.parse_content_stream(page), 0,
                                                                  resources, found, 0)  # fmt: skip
        if found.invisible:
            found.content = pikepdf.unparse_content_stream(kept)
    except (pikepdf.PdfError, ValueError, TypeError) as exc:
        log.info("a page's content cannot be parsed (%s): its own text is left as it is", exc)
        return Found()
    return found


def _content_bytes(contents) -> bytes:
    if contents is None:
        return b""
    parts = contents if isinstance(contents, pikepdf.Array) else [contents]
    return b"\n".join(part.read_bytes() for part in parts if isinstance(part, pikepdf.Stream))


def _forms(resources) -> dict[str, pikepdf.Stream]:
    xobjects = resources.get("/XObject") if isinstance(resources, pikepdf.Dictionary) else None
    if not isinstance(xobjects, pikepdf.Dictionary):
        return {}
    return {name: x for name, x in xobjects.items() if isinstance(x, pikepdf.Stream) and x.get("/Subtype") == "/Form"}


def _may_show_text(data: bytes, resources) -> bool:
    return b"BT" in data or bool(_forms(resources))


def _without_invisible(instructions, mode: int, resources, found: Found, depth: int) -> tuple[list, int, int]:
    """The instructions without their invisible text (form XObjects they draw filtered into
    ``found.forms``); the count of invisible and visible text shown."""
    kept, saved, invisible, visible = [], [], 0, 0
    forms = _forms(resources)
    for instruction in instructions:
        if isinstance(instruction, pikepdf.ContentStreamInlineImage):
            kept.append(instruction)
            continue
        operator, operands = str(instruction.operator), instruction.operands
        if operator == "q":
            saved.append(mode)
        elif operator == "Q":
            mode = saved.pop() if saved else 0
        elif operator == "Tr" and operands:
            mode = int(operands[0])
        elif operator in SHOWS:
            if mode in INVISIBLE_MODES:
                invisible += 1
                kept.extend(_moves_only(operator, operands))
                continue
            visible += 1
        elif operator == "Do" and operands and depth < FORM_DEPTH:
            form = forms.get(str(operands[0]))
            if form is not None and form.objgen not in found.forms:
                inner = form.get("/Resources", resources)
                drawn, hidden, shown = _without_invisible(pikepdf.parse_content_stream(form), mode, inner, found,
                                                          depth + 1)  # fmt: skip
                invisible, visible = invisible + hidden, visible + shown
                if hidden and form.is_indirect:
                    found.forms[form.objgen] = (form, pikepdf.unparse_content_stream(drawn))
        kept.append(instruction)
    return kept, invisible, visible


def _moves_only(operator: str, operands) -> list:
    """What an invisible show does besides showing: ' and " move to the next line (" sets the
    spacing first), which the visible text after it in the same BT may rely on."""
    instruction = pikepdf.ContentStreamInstruction
    if operator == "'":
        return [instruction([], pikepdf.Operator("T*"))]
    if operator == '"' and len(operands) >= 2:
        return [instruction([operands[0]], pikepdf.Operator("Tw")), instruction([operands[1]], pikepdf.Operator("Tc")),
                instruction([], pikepdf.Operator("T*"))]  # fmt: skip
    return []


def raster(document: pdfium.PdfDocument, number: int, size: tuple[float, float], result: StoredResult | None) -> bytes:
    """Page ``number`` drawn as a JPEG as a reader shows it, at the pixels the pod read it at
    (at most RASTER_DPI_MAX), for a page whose text is replaced by ours. The caller holds pdfium's
    lock."""
    width = result.width if result else None
    scale = min(RASTER_DPI_MAX / 72, float(width) / size[0]) if width else 200 / 72
    with contextlib.closing(document[number - 1]) as page:
        image: Image.Image = page.render(scale=scale).to_pil()
    buffer = io.BytesIO()
    image.convert("RGB").save(buffer, format="JPEG", quality=RASTER_JPEG_QUALITY)
    return buffer.getvalue()


Rect = tuple[float, float, float, float]  # left, bottom, right, top, in points


def visible_text(document: pdfium.PdfDocument, number: int) -> tuple[list[Rect], Rect] | None:
    """Page ``number``'s visible text objects' rectangles and its crop box, in its user space; None
    for a turned page (/Rotate: its reading's boxes are not matched). The caller holds pdfium's lock."""
    with contextlib.closing(document[number - 1]) as page:
        if page.get_rotation():
            return None
        shown = [obj.get_bounds() for obj in page.get_objects(filter=[pdfium.raw.FPDF_PAGEOBJ_TEXT], max_depth=FORM_DEPTH)
                 if pdfium.raw.FPDFTextObj_GetTextRenderMode(obj.raw) not in INVISIBLE_MODES]  # fmt: skip
        return shown, page.get_cropbox()


def without_lines_over(result: StoredResult, rects: list[Rect], crop: Rect) -> StoredResult:
    """The reading without its lines that lie mostly (COVERED_SHARE) over the page's visible text:
    that text stays on the page and is found there. A reading turned upright or without boxes is
    left whole."""
    width, height, lines = result.width, result.height, result.lines
    if not rects or not width or not height or result.rotation:
        return result
    left, bottom, right, top = crop
    scale_x, scale_y = (right - left) / width, (top - bottom) / height
    kept = []
    for line in lines:
        box = line.get("bbox")
        if isinstance(box, list | tuple) and len(box) == 4:
            x0, y0, x1, y1 = (float(v) for v in box)
            points = (left + x0 * scale_x, top - y1 * scale_y, left + x1 * scale_x, top - y0 * scale_y)
            if _covered(points, rects) >= COVERED_SHARE:
                continue
        kept.append(line)
    if len(kept) == len(lines):
        return result
    return result.with_lines(kept)


def _covered(box: Rect, rects: list[Rect]) -> float:
    """The share of ``box`` that ``rects`` cover (their overlaps counted once each: at most 1)."""
    area = (box[2] - box[0]) * (box[3] - box[1])
    if area <= 0:
        return 0.0
    overlap = sum(max(0.0, min(box[2], r[2]) - max(box[0], r[0])) * max(0.0, min(box[3], r[3]) - max(box[1], r[1]))
                  for r in rects)  # fmt: skip
    return min(1.0, overlap / area)
