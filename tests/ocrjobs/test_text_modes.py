"""Pages that already have text (issue 40, item 3): a job's ``text_mode`` (skip, redo, force, as
OCRmyPDF names them) says what becomes of their text. An earlier OCR's layer is replaced, not
doubled; a broken font's mojibake is read whatever the mode, with a warning, and never reaches
the searchable PDF."""

from __future__ import annotations

import io
import shutil
import subprocess

import pikepdf
import pytest
from PIL import ImageChops, ImageStat

from ocrjobs.models import Job, Page
from ocrjobs.services import old_text
from podserver import pages
from podserver.textlayer import mark_unusable
from tests.factories import PAGES_TRUTH
from tests.ocrjobs.helpers import complete_all, split, submit
from tests.ocrjobs.test_outputs import boxed, built_pdf, text_of
from tests.textlayers import broken_font_pdf, pretexted_pdf, vector_text_pdf

pytestmark = pytest.mark.usefixtures("local_pool")

LINES = PAGES_TRUTH[0]
EARLIER = [*LINES, "zebrafish marker of an earlier reading"]  # what an earlier OCR left, one line more
OURS = ["ours alone quokka", "read by the pod"]  # a made-up reading, told apart from the page's own text


def pdftotext(pdf: bytes) -> str:
    run = subprocess.run(["pdftotext", "-", "-"], input=pdf, capture_output=True, timeout=60, check=True)
    return run.stdout.decode()


def pod_reads(tmp_path, data: bytes, engine) -> dict:
    """The page read as the pod reads it: rendered by pdfium at 200 DPI, its text layer judged."""
    path = tmp_path / "page.pdf"
    path.write_bytes(data)
    image = pages.render_pdf_page(path, 1, 200)
    return mark_unusable(engine.ocr(image, "eng", 60), image.info.get(pages.TEXT_LAYER_PROBLEM))


def read_and_build(owner, data: bytes, result: dict, **options) -> tuple[Job, bytes]:
    job = submit(owner, {"old.pdf": data}, **options)
    split(job)
    complete_all(job, results={(0, 1): result})
    return job, built_pdf(job)


@pytest.mark.skipif(not shutil.which("pdftotext"), reason="poppler-utils (bin/install test)")
@pytest.mark.parametrize("mode", ["redo", "force"])
def test_an_earlier_ocr_layer_is_replaced_not_doubled(ordinary_user, engines, tmp_path, mode):
    data = pretexted_pdf(LINES, EARLIER)
    result = pod_reads(tmp_path, data, engines["api"])
    ocr_words = result["text"].split()
    assert pdftotext(data).split().count("zebrafish") == 1  # the fixture has its earlier layer

    _, pdf = read_and_build(ordinary_user, data, result, text_mode=mode)

    extracted = pdftotext(pdf).split()
    assert len(extracted) <= 1.2 * len(ocr_words), (len(extracted), len(ocr_words))
    assert "zebrafish" not in extracted
    assert "authority," in extracted or "authority" in extracted  # ours is there


def test_redo_keeps_visible_text_and_removes_only_the_invisible(ordinary_user):
    data = _with_visible_line(pretexted_pdf(LINES, EARLIER))
    with pikepdf.open(io.BytesIO(data)) as pdf:
        found = old_text.find(pdf.pages[0])
        assert (found.visible, found.invisible) == (1, len(EARLIER))

    _, built = read_and_build(ordinary_user, data, boxed(OURS), text_mode="redo")

    (text,) = text_of(built)
    assert "visible footer stays" in text and "quokka" in text and "zebrafish" not in text


@pytest.mark.skipif(not shutil.which("pdftotext"), reason="poppler-utils (bin/install test)")
def test_redo_finds_a_born_digital_pages_text_once_not_beside_our_reading(ordinary_user, engines, tmp_path):
    # The page's visible text stays in redo; our lines over it are left out of our layer (read
    # again, they doubled it: 2x the words), as OCRmyPDF's redo reads only what is not text.
    data = vector_text_pdf(LINES)
    result = pod_reads(tmp_path, data, engines["api"])
    own = pdftotext(data).split()
    assert len(result["lines"]) >= len(LINES)  # the pod read every line

    _, pdf = read_and_build(ordinary_user, data, result, text_mode="redo")

    extracted = pdftotext(pdf).split()
    assert len(extracted) <= 1.2 * len(own), (len(extracted), len(own))
    assert extracted == own
    assert text_of(pdf)[0].split() == own  # pdfium's too (it keeps a duplicate poppler drops)


@pytest.mark.skipif(not shutil.which("pdftotext"), reason="poppler-utils (bin/install test)")
def test_redo_keeps_our_reading_of_a_scan_beside_the_visible_line_it_carries(ordinary_user, engines, tmp_path):
    data = _with_visible_line(pretexted_pdf(LINES, EARLIER))
    result = pod_reads(tmp_path, data, engines["api"])
    assert "footer" in result["text"]  # the pod read the visible line with the scan's

    _, pdf = read_and_build(ordinary_user, data, result, text_mode="redo")

    (extracted,) = text_of(pdf)  # (pdfium's text: poppler's drops a duplicate drawn over its twin)
    assert extracted.count("footer") == 1  # the page's own, not ours beside it
    assert "authority" in extracted and "zebrafish" not in extracted  # the scan's lines are ours


def test_force_gives_our_text_only_and_the_page_looks_the_same(ordinary_user, tmp_path):
    data = vector_text_pdf(LINES)

    _, built = read_and_build(ordinary_user, data, boxed(OURS), text_mode="force")

    (text,) = text_of(built)
    assert "quokka" in text and "Quarterly" not in text
    before, after = tmp_path / "before.pdf", tmp_path / "after.pdf"
    before.write_bytes(data)
    after.write_bytes(built)
    assert _difference(pages.render_pdf_page(before, 1, 72), pages.render_pdf_page(after, 1, 72)) < 3.0


def test_skip_keeps_a_usable_layer_as_the_pages_text_and_the_pdf_as_it_was(ordinary_user):
    job = submit(ordinary_user, {"old.pdf": pretexted_pdf(LINES, EARLIER)}, text_mode="skip")
    split(job)

    page = Page.objects.get(job=job)
    assert page.status == Page.Status.DONE and "zebrafish" in page.read_result()["text"]
    assert "zebrafish" in text_of(built_pdf(job))[0]


@pytest.mark.parametrize("mode", ["skip", "redo", "force"])
def test_a_broken_font_page_is_read_in_every_mode_with_a_warning_and_no_mojibake(ordinary_user, engines, tmp_path,
                                                                                 mode):  # fmt: skip
    data = broken_font_pdf(LINES)
    assert "䴀" in text_of(data)[0]  # the fixture's layer is mojibake
    job = submit(ordinary_user, {"broken.pdf": data}, text_mode=mode)
    split(job)
    assert Page.objects.get(job=job).status == Page.Status.PENDING  # read, even when skipping text pages
    result = pod_reads(tmp_path, data, engines["api"])

    complete_all(job, results={(0, 1): result})
    built = built_pdf(job)

    page = Page.objects.get(job=job)
    assert page.warnings == 1 and "text layer is unusable" in page.read_result()["warnings"][0]
    (text,) = text_of(built)
    assert "Quarterly" in text and not any(0x2000 <= ord(c) <= 0x7E00 and ord(c) & 0xFF == 0 for c in text)


def _with_visible_line(data: bytes) -> bytes:
    """The PDF with one visible line more, drawn by its own font (Helvetica: a standard font)."""
    with pikepdf.open(io.BytesIO(data)) as pdf:
        page = pdf.pages[0]
        font = pdf.make_indirect(pikepdf.Dictionary(Type=pikepdf.Name.Font, Subtype=pikepdf.Name.Type1,
                                                    BaseFont=pikepdf.Name.Helvetica))  # fmt: skip
        page.obj.Resources.Font.FooterFont = font
        page.contents_add(pdf.make_stream(b"BT /FooterFont 12 Tf 0 Tr 72 40 Td (visible footer stays) Tj ET"))
        out = io.BytesIO()
        pdf.save(out)
    return out.getvalue()


def _difference(a, b) -> float:
    """Mean absolute difference of two grey renders, 0-255."""
    assert a.size == b.size
    return ImageStat.Stat(ImageChops.difference(a.convert("L"), b.convert("L"))).mean[0]


def test_force_draws_a_turned_page_as_it_is_shown(ordinary_user, tmp_path):
    with pikepdf.open(io.BytesIO(vector_text_pdf(LINES))) as pdf:
        pdf.pages[0].Rotate = 90
        out = io.BytesIO()
        pdf.save(out)
    data = out.getvalue()

    _, built = read_and_build(ordinary_user, data, boxed(OURS), text_mode="force")

    before, after = tmp_path / "before.pdf", tmp_path / "after.pdf"
    before.write_bytes(data)
    after.write_bytes(built)
    shown = pages.render_pdf_page(before, 1, 72)
    assert shown.width > shown.height  # on its side
    assert _difference(shown, pages.render_pdf_page(after, 1, 72)) < 3.0
    assert "Quarterly" not in text_of(built)[0]


def test_a_page_whose_content_cannot_be_parsed_keeps_it_and_gets_our_layer(ordinary_user):
    with pikepdf.open(io.BytesIO(pretexted_pdf(LINES, EARLIER))) as pdf:
        pdf.pages[0].contents_add(pdf.make_stream(b"BT (unterminated Tj ET"))
        out = io.BytesIO()
        pdf.save(out)

    _, built = read_and_build(ordinary_user, out.getvalue(), boxed(OURS), text_mode="redo")

    assert "quokka" in text_of(built)[0]
