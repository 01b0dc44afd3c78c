"""A searchable PDF's text layer that search works on whichever way its lines run (issue 40): each
line drawn along its baseline at its angle, so that poppler's pdftotext and pdfium (Chrome's
reader) give back a turned or skewed page's phrases in order."""

from __future__ import annotations

import io
import shutil
import subprocess

import pypdfium2 as pdfium
import pytest

from podserver.pages import decode_image
from tests.ocrjobs.helpers import complete_all, split, submit
from tests.ocrjobs.test_outputs import built_pdf
from tests.podserver.helpers import letter_page, page_lines

# The text layer and tesseract, not the database: once, on the SQLite run.
pytestmark = [pytest.mark.usefixtures("local_pool"), pytest.mark.once_sqlite]


def word_pairs(lines: list[str]) -> list[tuple[str, str]]:
    return [pair for line in lines for pair in zip(line.split(), line.split()[1:], strict=False)]


def pairs_found(extracted: str, lines: list[str]) -> float:
    """The share of each line's neighbouring words that come out neighbours, in order."""
    words = extracted.split()
    found = set(zip(words, words[1:], strict=False))
    wanted = word_pairs(lines)
    return sum(pair in found for pair in wanted) / len(wanted)


def pdftotext(pdf: bytes) -> str:
    run = subprocess.run(["pdftotext", "-", "-"], input=pdf, capture_output=True, timeout=60, check=True)
    return run.stdout.decode()


def pdfium_text(pdf: bytes) -> str:
    document = pdfium.PdfDocument(pdf)
    return "\n".join(document[i].get_textpage().get_text_bounded() for i in range(len(document)))


EXTRACTORS = {"pdfium": pdfium_text}
if shutil.which("pdftotext"):  # bin/install test installs it (poppler-utils)
    EXTRACTORS["pdftotext"] = pdftotext


# Single-spaced long lines: a skew of 3° lifts a line's end past its neighbour's start. (At -2°
# and -3° tesseract alone joins or loses such lines: the pod reads them again level.)
@pytest.mark.parametrize("turned", [90, 180, 270, 3, -2])
def test_a_turned_or_skewed_pages_phrases_come_back_in_order(ordinary_user, engines, turned):
    lines = page_lines(10, seed=turned % 7, words=14)  # long lines: a skew lifts their ends
    buffer = io.BytesIO()
    letter_page(lines, leading=40).rotate(turned, expand=True, fillcolor=255).save(buffer, format="PNG", dpi=(200, 200))
    job = submit(ordinary_user, {"scan.png": buffer.getvalue()})
    split(job)
    result = engines["api"].ocr(decode_image(buffer.getvalue()), "eng", 60)  # as the pod reads it
    complete_all(job, results={(0, 1): result})

    pdf = built_pdf(job)

    found = {name: pairs_found(extract(pdf), lines) for name, extract in EXTRACTORS.items()}
    assert all(share >= 0.9 for share in found.values()), found
