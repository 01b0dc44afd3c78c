"""The searchable PDF written as an incremental update of the original (ocrjobs/services/pdf_update.py,
what keeps a build's memory bounded by a chunk of pages): the original's bytes kept as they are,
the layer placed as qpdf's add_overlay places it (rotated, cropped, inherited, nested page trees,
either kind of cross-reference), and qpdf's rewrite where an update cannot be written."""

from __future__ import annotations

import io
from pathlib import Path

import pikepdf
import pypdfium2 as pdfium
import pytest

from fleetadmin import leases
from ocrjobs.models import SearchablePdf
from ocrjobs.services import searchable_pdf
from ocrjobs.services.pdf_update import Unsuitable, open_update
from tests.factories import pdf_bytes
from tests.ocrjobs.helpers import complete_all, split, submit
from tests.ocrjobs.test_outputs import boxed, built_pdf, sizes_of, text_of

LINES = [["Water levels rose"], ["Three pumps serviced"], ["Budget report north"], ["River gauge spring"]]


def shaped(*, xref_streams: bool = False, nested: bool = False, encrypted: bool = False) -> bytes:
    """Four pages turned 0, 90, 180 and 270 degrees, the second cropped off its origin; ``nested``:
    pages 2 and 3 under a /Pages node of their own that gives the second its /Rotate and both
    their /Resources (the third has its own): shown as the flat file is."""
    with pikepdf.open(io.BytesIO(pdf_bytes(LINES))) as pdf:
        for page, rotate in zip(pdf.pages, (0, 90, 180, 270), strict=True):
            page.obj.Rotate = rotate
        box = pdf.pages[1].mediabox
        pdf.pages[1].obj.CropBox = [float(box[0]) + 20, float(box[1]) + 30, float(box[2]) - 10, float(box[3]) - 40]
        if nested:
            root = pdf.Root.Pages
            kids = list(root.Kids)
            resources = kids[1].Resources
            node = pdf.make_indirect(pikepdf.Dictionary(Type=pikepdf.Name.Pages, Kids=pikepdf.Array(kids[1:3]),
                                                        Count=2, Parent=root, Rotate=90, Resources=resources))  # fmt: skip
            for kid in kids[1:3]:
                kid.Parent = node
            del kids[1]["/Rotate"]  # (the third keeps its own 180 over the node's 90)
            kids[2].Resources = pikepdf.Dictionary(XObject=kids[2].Resources.XObject)  # its own, over the node's
            del kids[1]["/Resources"]
            root.Kids = pikepdf.Array([kids[0], node, kids[3]])
        out = io.BytesIO()
        mode = pikepdf.ObjectStreamMode.generate if xref_streams else pikepdf.ObjectStreamMode.disable
        encryption = pikepdf.Encryption(owner="owner", user="") if encrypted else False
        pdf.save(out, object_stream_mode=mode, encryption=encryption)
        return out.getvalue()


def handmade(rotate: int, *, inherit: bool = True) -> bytes:
    """Two pages whose /Resources, /MediaBox and /Rotate are given by the /Pages node above them
    (qpdf copies inherited attributes down to the pages when it writes a file: written by hand),
    or, not ``inherit``, by each page."""
    content = b"BT /F0 24 Tf 72 700 Td (Original words) Tj ET"
    attributes = b"/MediaBox[0 0 612 792]/Rotate %d/Resources<</Font<</F0 6 0 R>>>>" % rotate
    node, page = (attributes, b"") if inherit else (b"", attributes)
    objects = [
        b"<</Type/Catalog/Pages 2 0 R>>",
        b"<</Type/Pages/Kids[3 0 R]/Count 2>>",
        b"<</Type/Pages/Parent 2 0 R/Kids[4 0 R 5 0 R]/Count 2%s>>" % node,
        b"<</Type/Page/Parent 3 0 R/Contents 7 0 R%s>>" % page,
        b"<</Type/Page/Parent 3 0 R/Contents 7 0 R%s>>" % page,
        b"<</Type/Font/Subtype/Type1/BaseFont/Helvetica>>",
        b"<</Length %d>>stream\n%s\nendstream" % (len(content), content),
    ]
    out, offsets = bytearray(b"%PDF-1.4\n"), []
    for number, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n%s\nendobj\n" % (number, body)
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f\r\n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n\r\n" % offset for offset in offsets)
    out += b"trailer\n<</Size %d/Root 1 0 R>>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref)
    return bytes(out)


@pytest.mark.parametrize("rotate", [0, 90])
def test_inherited_resources_and_rotation_are_kept(ordinary_user, local_pool, tmp_path, rotate):
    def build(original: bytes) -> bytes:
        job = submit(ordinary_user, {"inherited.pdf": original})
        split(job)
        complete_all(job, results={(0, 1): boxed(["Water levels rose"]), (0, 2): boxed(["Three pumps serviced"])})
        return built_pdf(job), job

    original = handmade(rotate)
    built, job = build(original)
    assert built.startswith(original)
    texts = text_of(built)
    assert "Original words" in texts[0] and "Water levels rose" in texts[0]  # its font still found
    assert "Original words" in texts[1] and "Three pumps serviced" in texts[1]
    assert placed(built) == placed(rewritten(job, tmp_path))
    assert placed(built) == placed(build(handmade(rotate, inherit=False))[0])  # where the pages' own put it


def placed(pdf: bytes) -> list[tuple[str, tuple[float, ...]]]:
    """Each page's text and where each of its characters is drawn."""
    document = pdfium.PdfDocument(pdf)
    out = []
    for i in range(len(document)):
        text = document[i].get_textpage()
        boxes = tuple(tuple(round(v) for v in text.get_charbox(c)) for c in range(text.count_chars()))
        out.append((text.get_text_bounded().strip(), boxes))
    return out


def job_of(user, data: bytes):
    job = submit(user, {"shaped.pdf": data})
    split(job)
    complete_all(job, results={(0, n + 1): boxed(lines) for n, lines in enumerate(LINES)})
    return job


def rewritten(job, tmp_path: Path) -> bytes:
    """The same document's searchable PDF as qpdf rewrites it whole (add_overlay, then save)."""
    document = job.documents.get()
    target = tmp_path / "rewritten.pdf"
    from ocrjobs import storage

    with storage.document_local(document.source) as source:
        searchable_pdf._rewrite_pdf(source, document, target, leases.Hold(SearchablePdf.objects.none(), ""))
    return target.read_bytes()


@pytest.mark.parametrize(
    "shape", [{}, {"xref_streams": True}, {"nested": True}, {"nested": True, "xref_streams": True}], ids=str
)
def test_the_update_keeps_the_original_and_places_the_text_as_add_overlay_does(ordinary_user, local_pool, tmp_path,
                                                                               shape):  # fmt: skip
    original = shaped(**shape)
    job = job_of(ordinary_user, original)
    built = built_pdf(job)
    assert built.startswith(original)  # the original's bytes as they were: an update after them
    with pikepdf.open(io.BytesIO(built)) as pdf:
        assert pdf.get_warnings() == [] and pdf.check_pdf_syntax() == []
        assert len(pdf.pages) == 4
    assert placed(built) == placed(rewritten(job, tmp_path))
    assert [text for text, _ in placed(built)] == [line[0] for line in LINES]
    assert text_of(built) == text_of(rewritten(job, tmp_path))
    if shape:  # the same pages shown the same way: the text where the flat file's is
        assert placed(built) == placed(built_pdf(job_of(ordinary_user, shaped())))


def test_an_encrypted_pdf_is_rewritten_by_qpdf_and_searchable_all_the_same(ordinary_user, local_pool, monkeypatch):
    written = []
    real = searchable_pdf._rewrite_pdf
    monkeypatch.setattr(searchable_pdf, "_rewrite_pdf", lambda *args: written.append(1) or real(*args))
    built = built_pdf(job_of(ordinary_user, shaped(encrypted=True)))
    assert written == [1]
    assert [text for text, _ in placed(built)] == [line[0] for line in LINES]


def test_an_update_is_refused_for_a_file_qpdf_repaired(tmp_path):
    damaged = tmp_path / "damaged.pdf"
    data = pdf_bytes(LINES[:1])
    at = data.rindex(b"startxref")
    offset = int(data[at:].split()[1])
    damaged.write_bytes(data[:at] + b"startxref\n%d\n%%%%EOF\n" % (offset + 7))  # pointing past its table
    with pikepdf.open(damaged) as pdf, pytest.raises(Unsuitable), (tmp_path / "out.pdf").open("wb") as out:
        open_update(damaged, pdf, out)


def test_a_build_holds_a_chunk_of_pages_not_the_document(ordinary_user, local_pool, monkeypatch):
    """The update path opens the original and the layer anew for each chunk: with two pages to a
    chunk, each pikepdf.Pdf it opens sees at most one chunk's pages."""
    monkeypatch.setattr(searchable_pdf, "PAGES_PER_LAYER", 2)
    job = job_of(ordinary_user, shaped())
    opened, real_open = [], pikepdf.open

    def counting_open(*args, **kwargs):
        pdf = real_open(*args, **kwargs)
        opened.append(pdf)
        return pdf

    monkeypatch.setattr(searchable_pdf.pikepdf, "open", counting_open)
    built = built_pdf(job)
    assert len(opened) == 1 + 2 * 2  # the first look, then the original and a layer for each chunk
    assert [text for text, _ in placed(built)] == [line[0] for line in LINES]


def test_a_many_frame_image_is_written_a_chunk_of_frames_at_a_time(ordinary_user, local_pool):
    """A TIFF of 20 frames (three chunks of IMAGES_PER_LAYER): a new file written page by page,
    every page its frame's size with its own text, read by qpdf without a warning."""
    from PIL import Image

    frames = [Image.new("L", (400, 200 + 10 * i), 255) for i in range(20)]
    buffer = io.BytesIO()
    frames[0].save(buffer, format="TIFF", save_all=True, append_images=frames[1:], dpi=(100, 100))
    job = submit(ordinary_user, {"scans.tiff": buffer.getvalue()})
    split(job)
    complete_all(
        job, results={(0, n): boxed([f"frame number {n}"], width=400, height=200 + 10 * (n - 1)) for n in range(1, 21)}
    )

    built = built_pdf(job)

    with pikepdf.open(io.BytesIO(built)) as pdf:
        assert pdf.get_warnings() == [] and pdf.check_pdf_syntax() == []
        assert len(pdf.pages) == 20
    assert [text.strip() for text in text_of(built)] == [f"frame number {n}" for n in range(1, 21)]
    assert sizes_of(built) == [(288.0, round((200 + 10 * i) * 0.72, 2)) for i in range(20)]
