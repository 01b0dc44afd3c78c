"""Searchable PDFs (issue 25): each document's original pages with an invisible text layer placed
from every recognised line's box, as OCRmyPDF makes them, built by a worker when the job ends.

How: reportlab draws the text layer, pikepdf lays it over the original pages.

- reportlab, of the three ways issue 25 allows, because it works for every engine and every
  page: tesseract's own text-only PDF exists only for tesseract and would have to come back from
  the pod with each page; OCRmyPDF's hocrtransform wants hOCR (one more format to write) and
  brings OCRmyPDF with it. reportlab writes text render mode 3 (invisible: searchable, copyable,
  never drawn), the horizontal scale that stretches a line over its box, and an embedded font
  subset with a ToUnicode map, so that what a reader extracts is the recognised text.
- pikepdf (qpdf) keeps the original PDF as it is, images and all: each page gets the layer as an
  overlay (a form XObject), which also undoes the page's /Rotate and crop box (the pod read the
  page as pdfium shows it: rotated and cropped). Pages whose PDF had a text layer already
  (``text_mode`` skip: their result says ``source: text layer``) are left as they are. A page the
  pod read keeps its own text by the job's ``text_mode`` (ocrjobs/services/old_text.py): an
  earlier OCR's invisible layer removed (redo, force), or the page drawn as an image (force, or a
  layer the pod found mojibake, when its text is visible), so that ours is not doubled.
- An image document becomes one PDF page per frame at the image's DPI (``IMAGE_DPI_DEFAULT``
  when the file says none), drawn by reportlab with the text over it; a JPEG goes in as its own
  bytes (no re-encoding), other images losslessly (Flate).

Coordinates: the pod reports each page's pixel size (``width``, ``height``) and each line's
``bbox`` in those pixels; the layer scales them to the page's size in points, so the render DPI
need not be known. Lines without a box (the ``vlm`` engine's) are stacked down the page: search
and copy find them, their place on the page is not theirs. A line with a ``baseline`` that slopes
(tesseract's, issue 40) is drawn along it: on its side or upside down at its angle, skewed a few
degrees level through its middle at its letters' height (``_draw_turned``), so that pdftotext,
pdf.js and pdfium give back its phrases (a 90° page's layer drawn level in its tall boxes gave
pdftotext none of its word pairs; now all).

Memory: the layer is made ``PAGES_PER_LAYER`` pages at a time, and each chunk's pages are
appended to a copy of the original as an incremental update (ocrjobs/services/pdf_update.py): the
original's bytes stay as they are, and a build holds one chunk of pages in qpdf, never the
document (bench/searchable_pdf.py: 77 bytes a page of heap growth at 1,000 pages, where overlaying
them all in one pikepdf.Pdf held ~16 kB a page). A file an update cannot take (encrypted, repaired
by qpdf) is overlaid and written whole by qpdf as before.

Length: the build's two ways (a PDF's pages updated, an image document drawn whole) share the
text layer and the row's lease and generation; pdf_update.py already holds the update's bytes.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import tempfile
import uuid
import zlib
from pathlib import Path

import pikepdf
import pypdfium2 as pdfium
from django.db import models, transaction
from django.utils import timezone
from PIL import Image, ImageOps
from reportlab.lib.utils import ImageReader
from reportlab.pdfbase import pdfmetrics
from reportlab.pdfbase.ttfonts import TTFont
from reportlab.pdfgen import canvas

from fleetadmin import leases
from ocrjobs import storage
from ocrjobs.models import Document, Job, Page, SearchablePdf
from ocrjobs.results import StoredResult
from ocrjobs.services import old_text, pdf_update
from ocrjobs.services.submission import PDFIUM_LOCK

log = logging.getLogger(__name__)

FONT_NAME = "FleetadminOcrText"
# bin/install installs fonts-dejavu-core; reportlab's own Vera is the fallback.
FONT_PATHS = ("/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",)
PAGES_PER_LAYER = 100  # text only: a few kB a page
IMAGES_PER_LAYER = 8  # pages that carry their image: reportlab holds a chunk until it writes it
IMAGE_DPI_DEFAULT = 300  # a scanner's usual; an image that states no DPI
IMAGE_DPI_RANGE = (36, 2400)
STACKED_FONT_POINTS = 10.0
# A frame no pod read is drawn at this many pixels at most (a letter page at about 120 DPI).
UNREAD_FRAME_PIXELS = 1_500_000
ERROR_MAX_CHARS = 500

_font: TTFont | None = None


def _text_font() -> TTFont:
    global _font
    if _font is None:
        path = next((p for p in FONT_PATHS if Path(p).is_file()), "Vera.ttf")
        _font = TTFont(FONT_NAME, path)
        pdfmetrics.registerFont(_font)
    return _font


def _keep_every_character(font: TTFont, text: str) -> None:
    """A character the font lacks (CJK in DejaVu Sans) would be written as code 0 and lost to
    search: reportlab maps what is not in the font's ``charToGlyph`` to .notdef without a
    ToUnicode entry. Mapped to glyph 0 here, it is still drawn as .notdef (invisible anyway)
    but keeps its code and its Unicode. No public hook does this; reportlab is pinned to 5.1
    and test_searchable_pdf's CJK line fails if this stops taking effect."""
    glyphs = font.face.charToGlyph
    for char in text:
        glyphs.setdefault(ord(char), 0)


# --- building ------------------------------------------------------------------------------------


def searchable_pdf_build(*, document_id: int) -> SearchablePdf | None:
    """Build (or build again) the document's searchable PDF and store it; None for a document
    that has no pages to build from (not split). Pages not read (failed, cancelled) keep their
    original page without a text layer, counted in ``pages_missing``.

    Safe to run twice, at once too: a build takes the row's ``generation`` when it starts and
    stores its file only if no later request for a build (a retry's end, a rebuild) has changed
    it since; an overtaken build removes its own file and leaves the row to the later one. A
    build that fails marks the row ``failed`` with the error (the job is not touched)."""
    document = Document.objects.select_related("job").filter(pk=document_id).first()
    if document is None or document.status != Document.Status.SPLIT:
        return None
    SearchablePdf.objects.get_or_create(document=document)
    rows = SearchablePdf.objects.filter(pk=document.pk)
    row, token, generation = _build_start(rows)
    if token is None:  # another copy of this task holds the row and builds it
        return row
    try:
        name, size = _build_file(document, leases.Hold(rows, token))  # renewed as it reads pages
    except leases.LeaseLost:  # a later build (a rebuild, the tick's resend) took the row: it stores
        log.info("document %s: the searchable PDF's build was taken over", document.pk)
        return rows.get()
    except Exception as exc:  # a document we cannot rebuild is shown as such, never fails the job
        log.exception("document %s: the searchable PDF failed", document.pk)
        rows.filter(generation=generation, task_lease_token=token).update(
            status=SearchablePdf.Status.FAILED,
            error=f"{type(exc).__name__}: {exc}"[:ERROR_MAX_CHARS],
            updated_at=timezone.now(),
            task_lease_until=None,
            attempts=0,  # it ended: only builds whose workers died count towards PDF_BUILD_ATTEMPTS
        )
        return rows.get()
    return _build_stored(rows, document, generation=generation, token=token, name=name, size=size)


def _build_start(rows: models.QuerySet[SearchablePdf]) -> tuple[SearchablePdf, str | None, int]:
    """(the row, the build's lease token, the generation it builds); no token when another build
    holds the row."""
    with transaction.atomic():
        row = rows.select_for_update().get()
        token = leases.acquire(rows)
        if token is None:
            return row, None, row.generation
        generation, row.attempts = row.generation, row.attempts + 1
        row.status, row.builds, row.updated_at = SearchablePdf.Status.BUILDING, row.builds + 1, timezone.now()
        row.save(update_fields=["status", "builds", "attempts", "updated_at"])
    return row, token, generation


def _build_file(document: Document, lease: leases.Hold) -> tuple[str, int]:
    """The document's searchable PDF built and put in the storage: (its name there, its size)."""
    fd, temporary = tempfile.mkstemp(prefix="fleetadmin-searchable-", suffix=".pdf")
    os.close(fd)  # (pikepdf writes it anew; document_store moves it into the storage)
    try:
        with storage.document_local(document.source) as source:
            if document.kind == Document.Kind.PDF:
                _overlay_pdf(source, document, Path(temporary), lease)
            else:
                _image_pdf(source, document, Path(temporary), lease)
        size = Path(temporary).stat().st_size
        name = storage.document_store(f"outputs/job-{document.job_id}/{document.pk}-{uuid.uuid4().hex[:8]}.pdf",
                                      Path(temporary))  # fmt: skip
    except Exception:
        Path(temporary).unlink(missing_ok=True)
        raise
    return name, size


def _build_stored(
    rows: models.QuerySet[SearchablePdf], document: Document, *, generation: int, token: str, name: str, size: int
) -> SearchablePdf:
    """The built file recorded on the row, unless a later build overtook this one (then it is
    removed); the row's previous file removed."""
    missing = Page.objects.filter(document=document).exclude(status=Page.Status.DONE).count()
    with transaction.atomic():
        row = rows.select_for_update().get()
        if row.generation != generation or row.task_lease_token != token:  # overtaken: the later build stores
            log.info("document %s: build of generation %s overtaken by %s", document.pk, generation, row.generation)
            transaction.on_commit(lambda: storage.document_delete(name))
            return row
        previous = row.name
        row.status, row.name, row.size_bytes, row.error = SearchablePdf.Status.BUILT, name, size, ""
        row.pages_missing, row.updated_at, row.task_lease_until = missing, timezone.now(), None
        row.attempts = 0  # it ended: only builds whose workers died count towards PDF_BUILD_ATTEMPTS
        row.save()
        if previous and previous != name:
            transaction.on_commit(lambda: storage.document_delete(previous))
    return row


class _Results:
    """The document's pages' results, asked for in page order and read from the database a
    chunk of rows at a time: a build never holds every page's result at once. Each page asked
    for keeps the build's lease."""

    def __init__(self, document: Document, lease: leases.Hold) -> None:
        self._lease = lease
        pages = Page.objects.filter(document=document).order_by("number").values_list("number", "status", "result")
        self._rows = pages.iterator(chunk_size=500)
        self._next: tuple[int, str, str] | None = next(self._rows, None)

    def get(self, number: int) -> StoredResult | None:
        """Page ``number``'s result (None: not done, or no such page); numbers asked in order."""
        self._lease.keep()
        while self._next is not None and self._next[0] < number:
            self._next = next(self._rows, None)
        if self._next is None or self._next[0] != number:
            return None
        _, status, result = self._next
        return StoredResult.from_json(result) if status == Page.Status.DONE else None


def _overlay_pdf(source: Path, document: Document, target: Path, lease: leases.Hold) -> None:
    try:
        _update_pdf(source, document, target, lease)
    except pdf_update.Unsuitable as exc:
        log.info("document %s: %s; its searchable PDF is written whole by qpdf", document.pk, exc)
        _rewrite_pdf(source, document, target, lease)


def _update_pdf(source: Path, document: Document, target: Path, lease: leases.Hold) -> None:
    """The original's bytes, then each layered page appended as an incremental update
    (ocrjobs/services/pdf_update.py), ``PAGES_PER_LAYER`` pages at a time: the original and the
    layer are opened anew for each chunk, so that qpdf's object cache never holds more than one."""
    results = _Results(document, lease)
    mode = document.job.text_mode
    per_layer = IMAGES_PER_LAYER if mode == Job.TextMode.FORCE else PAGES_PER_LAYER  # (pages drawn as images)
    rewritten: set[tuple[int, int]] = set()  # form XObjects whose invisible text is gone already
    with pikepdf.open(source) as pdf, target.open("wb") as out:
        update = pdf_update.open_update(source, pdf, out)
        count = int(pdf.Root.Pages.get("/Count", 0))
        push = b"%d 0 R" % update.new_number()
        update.append(update.next_number - 1, b"<<>>", stream=b"q\n")
        for start in range(0, count, per_layer):
            stop = min(count, start + per_layer)
            lease.confirm()  # a rebuild asked since: this build stops here (a storm of them burns no more)
            with pikepdf.open(source) as pdf, tempfile.TemporaryDirectory(prefix="fleetadmin-layer-") as tmp:
                pages = [pikepdf.Page(page) for page in pdf_update.page_dicts(pdf, start, stop)]
                if len(pages) != stop - start:
                    raise pdf_update.Unsuitable("fewer pages than its page tree counts")
                sizes = [_shown_size(page) for page in pages]
                chunk = [results.get(n) for n in range(start + 1, stop + 1)]
                wanted = [_wants_layer(result) for result in chunk]
                if not any(wanted):
                    continue
                found, treatments = _old_text(pages, chunk, wanted, mode)
                chunk = _beside_visible_text(source, start + 1, chunk, found, treatments, mode)
                images = _rasters(source, start + 1, treatments, sizes, chunk, Path(tmp))
                _draw_layer(Path(tmp) / "layer.pdf", sizes, chunk, wanted, images)
                with pikepdf.open(Path(tmp) / "layer.pdf") as layer:
                    copier = pdf_update.Copier(update)
                    for page, layer_page, want, old, treat in zip(pages, layer.pages, wanted, found, treatments,
                                                                   strict=True):  # fmt: skip
                        if want:
                            contents = _contents_kept(update, copier, old, treat, rewritten)
                            _append_layered_page(update, copier, pdf, page, layer_page, push, contents)
                if warnings := pdf.get_warnings():
                    raise pdf_update.Unsuitable(f"qpdf repaired it: {warnings[0]}")
            log.debug("document %s: pages %d to %d layered", document.pk, start + 1, stop)  # (bench: memory)
        update.close()


def _draw_layer(path: Path, sizes: list, chunk: list, wanted: list[bool], images: list[str | None]) -> None:
    """A PDF of the chunk's text layers, a page each (blank where none is wanted), over the
    page's image where it is drawn as one (``images``: a JPEG's path)."""
    page_canvas = canvas.Canvas(str(path), pageCompression=1, invariant=1)
    for size, result, want, image in zip(sizes, chunk, wanted, images, strict=True):
        page_canvas.setPageSize(size)
        if want:
            if image:
                page_canvas.drawImage(image, 0, 0, width=size[0], height=size[1])
            _draw_text(page_canvas, result, size)
        page_canvas.showPage()
    page_canvas.save()


def _old_text(pages: list[pikepdf.Page], chunk: list, wanted: list[bool], mode: str) -> tuple[list, list[str]]:
    """Each page's own text (old_text.find) and what becomes of it: keep, strip or raster."""
    found = [old_text.find(page) if want else None for page, want in zip(pages, wanted, strict=True)]
    treatments = [old_text.treatment(old, mode=mode, result=result) if old else "keep"
                  for old, result in zip(found, chunk, strict=True)]  # fmt: skip
    return found, treatments


def _beside_visible_text(source: Path, first: int, chunk: list, found: list, treatments: list[str], mode: str) -> list:
    """The chunk's readings, in redo without the lines over a page's own visible text (which stays:
    old_text.without_lines_over), pages ``first``..."""
    if mode != Job.TextMode.REDO or not any(old and old.visible and treat != "raster"
                                            for old, treat in zip(found, treatments, strict=True)):  # fmt: skip
        return chunk
    chunk = list(chunk)
    with PDFIUM_LOCK, contextlib.closing(pdfium.PdfDocument(str(source))) as document:
        for index, (old, treat) in enumerate(zip(found, treatments, strict=True)):
            if old and old.visible and treat != "raster" and chunk[index]:
                shown = old_text.visible_text(document, first + index)
                if shown is not None:
                    chunk[index] = old_text.without_lines_over(chunk[index], *shown)
    return chunk


def _rasters(source: Path, first: int, treatments: list[str], sizes: list, chunk: list, directory: Path) -> list:
    """A JPEG's path for each page drawn as an image (None for the others), pages ``first``..."""
    images: list[str | None] = [None] * len(treatments)
    if "raster" not in treatments:
        return images
    with PDFIUM_LOCK, contextlib.closing(pdfium.PdfDocument(str(source))) as document:
        for index, treat in enumerate(treatments):
            if treat == "raster":
                path = directory / f"page-{first + index}.jpg"
                path.write_bytes(old_text.raster(document, first + index, sizes[index], chunk[index]))
                images[index] = str(path)
    return images


def _contents_kept(update: pdf_update.Update, copier: pdf_update.Copier, old: old_text.Found | None, treat: str,
                   rewritten: set[tuple[int, int]]) -> list[bytes] | None:  # fmt: skip
    """The content streams the layered page keeps of its own: all (None), none (drawn as an image,
    in its layer), or its content without the invisible text, the form XObjects it draws rewritten
    without theirs under their own numbers (once a build)."""
    if treat == "raster":
        return []
    if treat != "strip" or old is None:
        return None
    for objgen, (form, data) in old.forms.items():
        if objgen not in rewritten:
            rewritten.add(objgen)
            kept = pikepdf.Dictionary({k: v for k, v in form.stream_dict.items()
                                       if k not in ("/Length", "/Filter", "/DecodeParms")})  # fmt: skip
            body = pdf_update.serialize(kept, pdf_update.same_ref, replace={"/Filter": b"/FlateDecode"}, itself=True)
            update.append(objgen[0], body, generation=objgen[1], stream=zlib.compress(data))
    if old.content is None:
        return None
    return [copier.write(pikepdf.Dictionary(Filter=pikepdf.Name.FlateDecode), stream=zlib.compress(old.content))]


def _append_layered_page(update: pdf_update.Update, copier: pdf_update.Copier, pdf: pikepdf.Pdf,
                         page: pikepdf.Page, layer_page: pikepdf.Page, push: bytes,
                         kept: list[bytes] | None = None) -> None:  # fmt: skip
    """The page again, its contents between q and Q, then the layer placed over it as a form
    XObject, as ``add_overlay`` does it (qpdf's placement: the page's crop box and /Rotate).
    ``kept``: the references of the contents it keeps instead of its own (_contents_kept)."""
    width, height = (float(v) for v in layer_page.mediabox[2:])
    contents = layer_page.obj.Contents
    data = b"\n".join(part.read_bytes() for part in (contents if isinstance(contents, pikepdf.Array) else [contents]))
    form = pikepdf.Dictionary(Type=pikepdf.Name.XObject, Subtype=pikepdf.Name.Form, BBox=[0, 0, width, height],
                              Resources=layer_page.obj.get("/Resources", pikepdf.Dictionary()),
                              Filter=pikepdf.Name.FlateDecode)  # fmt: skip
    form_ref = copier.write(form, stream=zlib.compress(data))
    resources = pdf_update.inherited(page.obj, "/Resources") or pikepdf.Dictionary()
    xobjects = resources.get("/XObject") or pikepdf.Dictionary()
    name, n = "/FleetadminOcr", 1
    while name in xobjects:
        name, n = f"/FleetadminOcr{n}", n + 1
    probe = pikepdf.Stream(pdf, b"", BBox=[0, 0, width, height])
    placement = page.calc_form_xobject_placement(probe, pikepdf.Name(name), pikepdf.Rectangle(page.trimbox),
                                                 allow_shrink=True, allow_expand=True)  # fmt: skip
    pop = b"%d 0 R" % update.new_number()
    update.append(update.next_number - 1, b"<<>>", stream=b"Q\n" + placement)
    ref = pdf_update.same_ref
    if kept is None:
        original = page.obj.get("/Contents")
        parts = original if isinstance(original, pikepdf.Array) else [original] if original is not None else []
        kept = [ref(part) for part in parts if isinstance(part, pikepdf.Object) and part.is_indirect]
    listed = b" ".join([push, *kept, pop])
    xobjects_pdf = pdf_update.serialize(xobjects, ref, replace={name: form_ref}, itself=True)
    resources_pdf = pdf_update.serialize(resources, ref, replace={"/XObject": xobjects_pdf}, itself=True)
    body = pdf_update.serialize(page.obj, ref, replace={"/Contents": b"[" + listed + b"]", "/Resources": resources_pdf},
                                itself=True)  # fmt: skip
    number, generation = page.obj.objgen
    update.append(number, body, generation=generation)


def _rewrite_pdf(source: Path, document: Document, target: Path, lease: leases.Hold) -> None:
    """The whole file written anew by qpdf, the layers overlaid (files the update cannot take)."""
    results = _Results(document, lease)
    with pikepdf.open(source) as pdf, contextlib.ExitStack() as layers:
        count = len(pdf.pages)
        for start in range(0, count, PAGES_PER_LAYER):
            numbers = range(start + 1, min(count, start + PAGES_PER_LAYER) + 1)
            pages = [pdf.pages[n - 1] for n in numbers]
            sizes = [_shown_size(page) for page in pages]
            chunk = [results.get(n) for n in numbers]
            wanted = [_wants_layer(result) for result in chunk]
            if not any(wanted):
                continue
            directory = Path(layers.enter_context(tempfile.TemporaryDirectory(prefix="fleetadmin-layer-")))
            found, treatments = _old_text(pages, chunk, wanted, document.job.text_mode)
            chunk = _beside_visible_text(source, start + 1, chunk, found, treatments, document.job.text_mode)
            _draw_layer(directory / "layer.pdf", sizes, chunk, wanted,
                        _rasters(source, start + 1, treatments, sizes, chunk, directory))  # fmt: skip
            layer = layers.enter_context(pikepdf.open(directory / "layer.pdf"))
            for index, page in enumerate(pages):
                if wanted[index]:
                    if treatments[index] == "raster":
                        page.obj.Contents = pdf.make_stream(b"")
                    elif treatments[index] == "strip":
                        for form, data in found[index].forms.values():
                            form.write(data)
                        if found[index].content is not None:
                            page.obj.Contents = pdf.make_stream(found[index].content)
                    page.add_overlay(layer.pages[index])
        pdf.save(target)


def _shown_size(page: pikepdf.Page) -> tuple[float, float]:
    """The page's size in points as a reader shows it (and the pod rendered it): its crop box,
    turned by its /Rotate."""
    box = page.cropbox
    width, height = abs(float(box[2]) - float(box[0])), abs(float(box[3]) - float(box[1]))
    rotate = int(pdf_update.inherited(page.obj, "/Rotate") or 0) % 360
    return (height, width) if rotate in (90, 270) else (width, height)


def _wants_layer(result: StoredResult | None) -> bool:
    """A page gets a text layer when the pod read it (a page that kept its own is left alone)."""
    return result is not None and result.source != "text layer" and bool(result.text.strip())


def _image_pdf(source: Path, document: Document, target: Path, lease: leases.Hold) -> None:
    """A PDF page per frame, ``IMAGES_PER_LAYER`` at a time drawn by reportlab into a file of
    their own, whose pages are copied into the new file as they come (pdf_update.new_pdf): a
    build holds a chunk of frames, never the document."""
    results = _Results(document, lease)
    with Image.open(source) as image, target.open("wb") as out:
        writer = pdf_update.new_pdf(out)
        frames = getattr(image, "n_frames", 1)
        passthrough = image.format == "JPEG" and frames == 1 and image.getexif().get(0x0112, 1) == 1
        for start in range(0, frames, IMAGES_PER_LAYER):
            stop = min(frames, start + IMAGES_PER_LAYER)
            lease.confirm()  # a rebuild asked since: this build stops here (a storm of them burns no more)
            with tempfile.TemporaryDirectory(prefix="fleetadmin-layer-") as tmp:
                path = Path(tmp) / "pages.pdf"
                page_canvas = canvas.Canvas(str(path), pageCompression=1, invariant=1)
                for frame in range(start, stop):
                    image.seek(frame)
                    size = _image_page_size(image)
                    page_canvas.setPageSize(size)
                    result = results.get(frame + 1)
                    upright = _as_read(_upright(image), result)
                    drawn = str(source) if passthrough and upright.size == image.size else ImageReader(upright)
                    page_canvas.drawImage(drawn, 0, 0, width=size[0], height=size[1])
                    if _wants_layer(result):
                        _draw_text(page_canvas, result, size)
                    page_canvas.showPage()
                page_canvas.save()
                with pikepdf.open(path) as pages:
                    copier = pdf_update.Copier(writer)
                    for page in pages.pages:
                        copier.add_page(page.obj)
            log.debug("document %s: pages %d to %d layered", document.pk, start + 1, stop)
        writer.close()


def _upright(image: Image.Image) -> Image.Image:
    """The frame as the pod read it (turned by its EXIF orientation), in a mode a PDF holds."""
    frame = ImageOps.exif_transpose(image)
    if frame.mode not in ("1", "L", "RGB", "CMYK"):
        frame = frame.convert("RGBA" if "A" in frame.getbands() else "RGB")
    return frame


def _as_read(frame: Image.Image, result: StoredResult | None) -> Image.Image:
    """The frame at the size the pod read it, never larger (review N2: a 100-megapixel frame drawn
    whole was 3.8 s and 1.3 GB); a frame no pod read (its job cancelled, its page failed) at
    UNREAD_FRAME_PIXELS at most. The page keeps its size in points: only its pixels are fewer."""
    width, height = frame.size
    bound = (int(result.width), int(result.height)) if result and result.width and result.height else None
    if not bound or min(bound) < 1:
        scale = min(1.0, (UNREAD_FRAME_PIXELS / (width * height)) ** 0.5)
        bound = (max(1, int(width * scale)), max(1, int(height * scale)))
    if width <= bound[0] and height <= bound[1]:
        return frame
    smaller = frame.copy()
    smaller.thumbnail(bound)  # keeps its proportions; reduces in steps (Image.reduce) first
    return smaller


def _image_page_size(image: Image.Image) -> tuple[float, float]:
    dpi = image.info.get("dpi") or (IMAGE_DPI_DEFAULT, IMAGE_DPI_DEFAULT)
    low, high = IMAGE_DPI_RANGE
    x_dpi, y_dpi = (float(d) if low <= float(d or 0) <= high else IMAGE_DPI_DEFAULT for d in dpi[:2])
    width, height = image.size
    if image.getexif().get(0x0112, 1) in (5, 6, 7, 8):  # turned a quarter: the pod read it upright
        width, height, x_dpi, y_dpi = height, width, y_dpi, x_dpi
    return width * 72 / x_dpi, height * 72 / y_dpi


# --- the text layer ------------------------------------------------------------------------------


def _draw_text(page_canvas: canvas.Canvas, result: StoredResult, size: tuple[float, float]) -> None:
    """The page's lines as invisible text, each stretched over its box, in the engine's order
    (its reading order: that is the order search and copy give)."""
    font = _text_font()
    page_width, page_height = size
    lines = result.lines_or_text()
    width, height = result.width, result.height
    ascent, descent = font.face.ascent / 1000, -font.face.descent / 1000  # (descent is negative)
    for index, line in enumerate(lines):
        text = str(line["text"]).strip()
        _keep_every_character(font, text)
        box = _box(line) if width and height else None
        along = _along_baseline(line, box, (page_width / width, page_height / height) if box else (1, 1), page_height)
        if along:
            _draw_turned(page_canvas, text, along, ascent + descent)
            continue
        if box:
            x0, y0, x1, y1 = box
            scale_x, scale_y = page_width / width, page_height / height
            left, right = x0 * scale_x, x1 * scale_x
            points = max(1.0, (y1 - y0) * scale_y / (ascent + descent))
            baseline = page_height - y1 * scale_y + descent * points
        else:  # no boxes (vlm): stacked down the page, a line each, so that search finds them
            points = min(STACKED_FONT_POINTS, page_height / (len(lines) + 2))
            left, right = points, page_width - points
            baseline = page_height - (index + 2) * points
        natural = pdfmetrics.stringWidth(text, FONT_NAME, points)
        if natural <= 0:
            continue
        stretch = 100 * (right - left) / natural
        if not box:
            stretch = min(100.0, stretch)
        text_object = page_canvas.beginText()
        text_object.setTextRenderMode(3)  # invisible: neither filled nor stroked
        text_object.setFont(FONT_NAME, points)
        text_object.setHorizScale(stretch)
        text_object.setTextOrigin(left, baseline)
        text_object.textOut(text)
        page_canvas.drawText(text_object)


# A line whose baseline slopes less than this is drawn level over its box (as before baselines
# were known): the same layer, byte for byte, for the upright pages most documents are.
LEVEL_DEGREES = 0.5


def _along_baseline(
    line: dict, box: tuple[float, float, float, float] | None, scale: tuple[float, float], page_height: float
) -> tuple[float, float, float, float, float] | None:
    """(x, y, angle in radians, length, thickness) in points of a line to draw along its baseline
    (turned, upside down or skewed), from its ``baseline`` [x0, y0, x1, y1] in the page's pixels;
    None for a level line, or one without a baseline."""
    baseline = line.get("baseline")
    if not box or not isinstance(baseline, list | tuple) or len(baseline) != 4:
        return None
    try:
        x0, y0, x1, y1 = (float(v) for v in baseline)
    except (TypeError, ValueError):
        return None
    scale_x, scale_y = scale
    dx, dy = (x1 - x0) * scale_x, (y0 - y1) * scale_y  # PDF's y axis points up
    length = math.hypot(dx, dy)
    if length <= 0:
        return None
    angle = math.atan2(dy, dx)
    if abs(math.degrees(angle)) < LEVEL_DEGREES:
        return None
    # The box holds the line turned by ``angle``: its sides are length·|cos| + thickness·|sin| and
    # length·|sin| + thickness·|cos|; the thickness comes from the side the length least fills.
    width, height = (box[2] - box[0]) * scale_x, (box[3] - box[1]) * scale_y
    cos, sin = abs(math.cos(angle)), abs(math.sin(angle))
    thickness = (height - length * sin) / cos if cos >= sin else (width - length * cos) / sin
    thickness = max(thickness, min(width, height) / 4, 1.0)
    return x0 * scale_x, page_height - y0 * scale_y, angle, length, thickness


# A line skewed less than this is drawn level, through the middle of its baseline, at the height of
# its letters (not of its box, which the slope makes taller: neighbouring lines' boxes overlap, and
# text stretched over them interleaved, 64 % of a skewed page's words findable). Drawn at its angle
# instead, poppler's pdftotext breaks a line sloping by a few degrees into pieces (58-81 % of a
# page's word pairs in order at 3° and -2°, against 100 % level); lines turned further (on their
# side, upside down) are drawn at their angle, which every extractor follows.
SKEW_LEVEL_DEGREES = 10.0


def _draw_turned(page_canvas: canvas.Canvas, text: str, along: tuple, em_height: float) -> None:
    """The line as invisible text along its baseline, stretched over it, so that text extractors
    (poppler's, pdf.js, pdfium) read it as one line in its own direction."""
    x, y, angle, length, thickness = along
    points = max(1.0, thickness / em_height)
    natural = pdfmetrics.stringWidth(text, FONT_NAME, points)
    if natural <= 0:
        return
    text_object = page_canvas.beginText()
    text_object.setTextRenderMode(3)
    text_object.setFont(FONT_NAME, points)
    if abs(math.degrees(angle)) < SKEW_LEVEL_DEGREES:
        run, rise = length * math.cos(angle), length * math.sin(angle)
        text_object.setHorizScale(100 * run / natural)
        text_object.setTextOrigin(x, y + rise / 2)
    else:
        text_object.setHorizScale(100 * length / natural)
        cos, sin = math.cos(angle), math.sin(angle)
        text_object.setTextTransform(cos, sin, -sin, cos, x, y)
    text_object.textOut(text)
    page_canvas.drawText(text_object)


def _box(line: dict) -> tuple[float, float, float, float] | None:
    box = line.get("bbox")
    if not isinstance(box, list | tuple) or len(box) != 4:
        return None
    try:
        x0, y0, x1, y1 = (float(v) for v in box)
    except (TypeError, ValueError):
        return None
    return (x0, y0, x1, y1) if x1 > x0 and y1 > y0 else None
