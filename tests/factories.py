"""Documents with known text, and broken ones, made on the fly."""

from __future__ import annotations

import difflib
import io
import time

import pypdfium2 as pdfium
from PIL import Image, ImageDraw, ImageFont

FONT = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf"

PAGES_TRUTH = [
    [
        "Quarterly report of the river authority, page one.",
        "Water levels rose by 12 centimetres in March.",
        "The northern gauge was replaced on 4 April 2026.",
    ],
    [
        "Page two lists the maintenance work done this spring.",
        "Three pumps were serviced and one valve was renewed.",
        "Costs stayed within the budget of 48,500 euros.",
    ],
    [
        "Page three closes the report with the outlook.",
        "Rainfall is expected to be average in the summer.",
        "The next inspection is planned for September.",
    ],
]


def render_page(lines: list[str], *, size: int = 36, width: int = 1700, height: int = 2200) -> Image.Image:
    """A clean scanned-looking page: black DejaVu text on white."""
    font = ImageFont.truetype(FONT, size)
    image = Image.new("L", (width, height), 255)
    draw = ImageDraw.Draw(image)
    for i, line in enumerate(lines):
        draw.text((150, 200 + i * int(size * 1.8)), line, font=font, fill=0)
    return image


def pdf_bytes(pages: list[list[str]] = PAGES_TRUTH, *, dpi: int = 200) -> bytes:
    images = [render_page(lines) for lines in pages]
    buffer = io.BytesIO()
    # Fixed dates: Pillow stamps the current time, so the same pages made a second apart would
    # differ by a byte (a test comparing two makes of one document then fails at random).
    stamp = time.strptime("2026-01-01", "%Y-%m-%d")
    images[0].save(buffer, format="PDF", save_all=True, append_images=images[1:], resolution=dpi,
                   creationDate=stamp, modDate=stamp)  # fmt: skip
    return buffer.getvalue()


def blank_pdf_bytes(pages: int, *, variant: int = 0) -> bytes:
    """A PDF of ``pages`` blank pages, quick to make however many (pods count and read its pages);
    each ``variant`` is a PDF of other bytes (its first page a point taller per variant)."""
    pdf = pdfium.PdfDocument.new()
    for number in range(pages):
        pdf.new_page(612, 792 + (variant if number == 0 else 0)).close()
    out = io.BytesIO()
    pdf.save(out)
    pdf.close()
    return out.getvalue()


def image_bytes(lines: list[str], fmt: str = "PNG") -> bytes:
    buffer = io.BytesIO()
    render_page(lines, width=1400, height=600).save(buffer, format=fmt)
    return buffer.getvalue()


def encrypted_pdf_bytes() -> bytes:
    import pikepdf

    source = pikepdf.open(io.BytesIO(pdf_bytes(PAGES_TRUTH[:1])))
    out = io.BytesIO()
    source.save(out, encryption=pikepdf.Encryption(user="secret", owner="owner-secret"))
    return out.getvalue()


def zero_page_pdf_bytes() -> bytes:
    import pikepdf

    out = io.BytesIO()
    pikepdf.new().save(out)
    return out.getvalue()


def corrupt_pdf_bytes() -> bytes:
    return b"%PDF-1.7\n1 0 obj\n<< /Type /Catalog /Pages 2 0 R >>\nthis is not a pdf body\n%%EOF\n"


def normalise(text: str) -> str:
    return " ".join(text.split())


def accuracy(got: str, truth: str) -> float:
    """Character accuracy as 1 - (edit distance / length), via difflib's ratio."""
    return difflib.SequenceMatcher(None, normalise(got), normalise(truth)).ratio()
