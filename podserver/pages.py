"""From bytes to a page image: decoding images, counting a document's pages, rendering one.

The pod renders its own pages (issue 12): PDF pages through pdfium at the DPI asked for, images
used as they are (a TIFF's frame N is page N). Every page comes out in a mode the engines handle
well (L or RGB), with no ``.format``, so nothing downstream re-encodes it lossily.
"""

from __future__ import annotations

import contextlib
import io
import threading
from pathlib import Path

import pypdfium2 as pdfium
from PIL import Image, ImageOps

from . import textlayer

MAX_PIXELS = 100_000_000
MIN_DPI, MAX_DPI = 36, 600

# decode_image checks the size itself (Pillow only warns between its MAX_IMAGE_PIXELS
# and twice that). Pillow's global is set by the pod process (__main__), not on
# import: a process that imports this module for other reasons keeps its own.

_MODES_16BIT = {"I", "I;16", "I;16B", "I;16L", "I;16N", "F"}

# pdfium is not thread-safe (pypdfium2's documentation): lanes render one at a time.
# A 200 DPI page takes tens of milliseconds, a GPU page hundreds, so lanes rarely wait.
_PDFIUM = threading.Lock()


class BadImage(ValueError):
    """The bytes are not an image (or document) we are willing to OCR."""


def is_pdf(head: bytes) -> bool:
    # PDF readers accept the header anywhere in the first KiB.
    return b"%PDF-" in head[:1024]


def count_pages(path: Path) -> int:
    """Pages of a PDF or frames of an image; BadImage when it is neither (or is encrypted)."""
    with open(path, "rb") as fh:
        head = fh.read(1024)
    if is_pdf(head):
        with _PDFIUM:
            try:
                pdf = pdfium.PdfDocument(str(path))
            except pdfium.PdfiumError as exc:
                raise BadImage(f"not a readable PDF: {exc}") from None
            try:
                count = len(pdf)
            finally:
                pdf.close()
        if count < 1:
            raise BadImage("the PDF has no pages")
        return count
    try:
        with Image.open(path) as img:
            return getattr(img, "n_frames", 1)
    except Exception as exc:
        raise BadImage(f"not a PDF or an image: {exc}") from None


def is_pdf_file(path: Path) -> bool:
    with open(path, "rb") as fh:
        return is_pdf(fh.read(1024))


def render_page(path: Path, page: int, dpi: int) -> Image.Image:
    """Page ``page`` (1-based) of a cached document, ready for an engine, in this process (the
    pod server renders PDF pages through podserver.render, with a time limit)."""
    if is_pdf_file(path):
        return render_pdf_page(path, page, dpi)
    return decode_image(path, frame=page - 1)  # read from the file: a lane holds its frame, not the document


def render_pdf_page(path: Path, page: int, dpi: int) -> Image.Image:
    """The page rendered at ``dpi``, or at the DPI that fits it under MAX_PIXELS (``RENDER_DPI``
    in its ``info`` says which)."""
    with _PDFIUM:
        pdf = pdfium.PdfDocument(str(path))
        try:
            if not 1 <= page <= len(pdf):
                raise BadImage(f"page {page} out of range: the document has {len(pdf)} pages")
            pdf_page = pdf[page - 1]
            try:
                width, height = pdf_page.get_size()
                dpi = fitting_dpi(width, height, scan_dpi(pdf_page, width, height, dpi))
                bitmap = pdf_page.render(scale=dpi / 72, grayscale=True)
                img = bitmap.to_pil()
                img.load()
                with contextlib.closing(pdf_page.get_textpage()) as textpage:
                    problem = textlayer.page_text_problem(textpage)
            finally:
                pdf_page.close()
        finally:
            pdf.close()
    img = _normalise(img)
    img.info[RENDER_DPI] = dpi
    if problem:
        img.info[TEXT_LAYER_PROBLEM] = problem
    return img


# Where a rendered page says the DPI it was rendered at (lower than asked for a page too large).
RENDER_DPI = "render_dpi"
# Where it says why its own text layer is unusable (podserver.textlayer), when it is.
TEXT_LAYER_PROBLEM = "text_layer_problem"


def pixels_at(width_pt: float, height_pt: float, dpi: int) -> int:
    """Pixels of a page of ``width_pt`` × ``height_pt`` points rendered at ``dpi``."""
    return round(width_pt * dpi / 72) * round(height_pt * dpi / 72)


# A small page holding a fine scan is rendered at its image's own resolution when that is finer than
# the DPI asked for (a 1.7-inch page holding a 2,400-DPI image read at 200 DPI is 334 pixels wide:
# unreadable), up to the pixels of a Letter page at the DPI asked for: a page never costs the engine
# more than an ordinary one because of it (a 300-DPI scan of a Letter page stays at the DPI asked).
# Images that cover less than SCAN_MIN_SHARE of the page (a logo, a signature) do not count; pages of
# more than SCAN_MAX_OBJECTS objects (vector drawings) are not searched for one.
LETTER_INCHES = (8.5, 11.0)
SCAN_MIN_SHARE = 0.1
SCAN_MAX_OBJECTS = 2_000


def scan_dpi(pdf_page: pdfium.PdfPage, width_pt: float, height_pt: float, dpi: int) -> int:
    """``dpi``, or the resolution of the image that covers most of the page when it is finer,
    within the pixels of a Letter page at ``dpi``."""
    page_area = width_pt * height_pt
    if page_area <= 0 or pdfium.raw.FPDFPage_CountObjects(pdf_page) > SCAN_MAX_OBJECTS:
        return dpi
    largest, image_dpi = 0.0, 0.0
    for image in pdf_page.get_objects(filter=[pdfium.raw.FPDF_PAGEOBJ_IMAGE], max_depth=2):
        left, bottom, right, top = image.get_bounds()
        area = (right - left) * (top - bottom)
        if area > largest:
            px_width, px_height = image.get_px_size()
            largest, image_dpi = area, 72 * (px_width * px_height / area) ** 0.5
    if largest < SCAN_MIN_SHARE * page_area or image_dpi <= dpi:
        return dpi
    letter_pixels = LETTER_INCHES[0] * LETTER_INCHES[1] * dpi * dpi
    ceiling = int(72 * (letter_pixels / page_area) ** 0.5)
    return max(dpi, min(round(image_dpi), ceiling))


def fitting_dpi(width_pt: float, height_pt: float, dpi: int) -> int:
    """``dpi``, or the largest DPI under it at which the page is at most MAX_PIXELS (a poster, a
    page of 200 inches: read at the resolution the pod can hold, not refused)."""
    if pixels_at(width_pt, height_pt, dpi) <= MAX_PIXELS:
        return dpi
    fitted = max(1, int(72 * (MAX_PIXELS / max(1.0, width_pt * height_pt)) ** 0.5))
    while fitted > 1 and pixels_at(width_pt, height_pt, fitted) > MAX_PIXELS:
        fitted -= 1
    return min(fitted, dpi)


def decode_image(data: bytes | Path, frame: int = 0) -> Image.Image:
    """Decode one page image (frame ``frame`` of a multi-frame TIFF) into L or RGB, from bytes or
    from a file (only the frame's bytes are read)."""

    def source():
        return data if isinstance(data, Path) else io.BytesIO(data)

    try:
        with Image.open(source()) as probe:
            _check_size(probe)
            probe.verify()
        # verify() leaves the image unusable, so decode again for real.
        with Image.open(source()) as opened:  # (closed once its frame is copied out)
            frames = getattr(opened, "n_frames", 1)
            if not 0 <= frame < frames:
                raise BadImage(f"page {frame + 1} out of range: the image has {frames} pages")
            if frame:
                opened.seek(frame)
                _check_size(opened)
            opened.load()
            img = ImageOps.exif_transpose(opened)  # a copy; phone photos arrive rotated otherwise
    except BadImage:
        raise
    except Image.DecompressionBombError as exc:
        raise BadImage(f"image too large: {exc}") from None
    # Corrupt data surfaces as OSError, ValueError, SyntaxError, struct.error, ...
    # depending on the plugin, so anything Pillow raises here means "not an image".
    except Exception as exc:
        raise BadImage(f"not an image: {exc}") from None
    return _normalise(img)


def _check_size(img: Image.Image) -> None:
    width, height = img.size
    if width * height > MAX_PIXELS:
        limit = MAX_PIXELS // 1_000_000
        raise BadImage(f"image too large: {width}x{height} exceeds {limit} megapixels")


def _normalise(img: Image.Image) -> Image.Image:
    # Always return a fresh image whose .format is None: pytesseract re-saves the
    # image in its original format, and a JPEG would be recompressed lossily.
    if "A" in img.getbands() or (img.mode == "P" and "transparency" in img.info):
        rgba = img.convert("RGBA")
        # Transparent means paper: flattening onto black would hide black ink.
        page = Image.new("RGB", img.size, "white")
        page.paste(rgba, mask=rgba.getchannel("A"))
        return page
    if img.mode in _MODES_16BIT:
        # convert("L") clips 16-bit values (most scans turn white); stretch instead.
        wide = img if img.mode == "F" else img.convert("I")
        lo, hi = wide.getextrema()
        scale = 255.0 / (hi - lo) if hi > lo else 1.0
        return wide.point(lambda v: (v - lo) * scale).convert("L")
    if img.mode in ("L", "1"):
        return img.convert("L")
    return img.convert("RGB")
