"""Searchable PDFs (issue 25): the worker's cost to build one, and what it holds in memory.

A scanned PDF of ``--pages`` pages (a JPEG of its own on each, 100 DPI, Letter) is stored as a
job's document with a made-up result for every page (``--lines`` lines, each with its box), and
its searchable PDF is built as the worker builds it (``searchable_pdf_build``), first for a tenth
of the pages, then for all. Printed: CPU seconds per 100 pages, and the peak growth of the
process's resident memory during each build (sampled every 5 ms from /proc/self/statm).

    python bench/searchable_pdf.py [--pages 1000] [--lines 40] [--pages-per-chunk N] [--database-url postgres://…]

Ends with one JSON line. Its "goal": ``text_matches`` (pdfium's text of sampled pages equals
their lines, >= 99% of characters), ``pages_and_sizes_kept`` (page count and sizes are the
original's), ``heap_bounded_by_a_chunk`` (the C heap in use, read when each chunk of pages is
written, grows less than ``HEAP_GROWTH_PER_PAGE_MAX`` bytes a page from a fifth of the pages to
the end; the chunk is the worker's, or a fifth of --pages when smaller; from a few hundred pages
on: below, the allocator's few kB of slack are divided by too few pages) — counted, asserted at a
small size by tests/bench/test_searchable_pdf.py and test_searchable_pdf_memory.py (300 pages:
~140 bytes a page) — and, for a reader on this machine, ``cpu_under_1s_per_100_pages``
and ``memory_bounded`` (the full build's sampled peak RSS growth under twice the tenth's plus 16 MB).

Measured here (2 cores, shared), 1,000 pages of 40 lines: 0.39 s of CPU per 100 pages, the peak
grew 2.3 MB (2.7 MB for 100 pages), the heap 77 bytes a page between chunks. Before the build
appended its pages to the original as an incremental update (ocrjobs/services/pdf_update.py) it
overlaid them in one pikepdf.Pdf and saved it: 0.60 s per 100 pages and a peak 25 MB higher, qpdf
holding ~16 kB a page modified (the copied form XObjects, the foreign streams' registrations).

Also control_plane_cpu_within_ceiling, asserted by CI: the full build's CPU a page (a worker's
task: control_plane_cpu_ms_per_page, bench/_cpu.py) under CPU_CEILING_MS_PER_PAGE.
"""

from __future__ import annotations

import argparse
import ctypes
import difflib
import io
import json
import logging
import os
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._cpu import CEILING_GOAL, cpu_line, per_unit, within_ceiling
from bench._setup import django_for_bench

WORDS = "water level gauge pump valve budget report river north spring costs euros serviced".split()
PIXELS = (850, 1100)  # Letter at 100 DPI
HEAP_GROWTH_PER_PAGE_MAX = 1024  # bytes: the cross-reference's 20 a page, Python's and the allocator's slack
# The build's CPU a page: 2.3 and 2.9 ms at 30 pages of 10 lines (CI's), 1.1-1.7 ms at 300 of 5
# (either database), 2.3-3.9 ms at 1,000 of 40. About three times CI's most.
CPU_CEILING_MS_PER_PAGE = 9.0


def scanned_pdf(pages: int) -> bytes:
    """A PDF whose every page is a JPEG of its own (a gradient with the page's number drawn on)."""
    import pikepdf
    from PIL import Image, ImageDraw

    pdf = pikepdf.new()
    base = Image.linear_gradient("L").resize(PIXELS)
    for number in range(1, pages + 1):
        image = base.copy()
        ImageDraw.Draw(image).text((100, 100 + number % 800), f"page {number}", fill=0)
        jpeg = io.BytesIO()
        image.save(jpeg, format="JPEG", quality=60)
        xobject = pikepdf.Stream(pdf, jpeg.getvalue(), Type=pikepdf.Name.XObject, Subtype=pikepdf.Name.Image,
                                 Width=PIXELS[0], Height=PIXELS[1], ColorSpace=pikepdf.Name.DeviceGray,
                                 BitsPerComponent=8, Filter=pikepdf.Name.DCTDecode)  # fmt: skip
        page = pikepdf.Dictionary(Type=pikepdf.Name.Page, MediaBox=[0, 0, 612, 792],
                                  Resources=pikepdf.Dictionary(XObject=pikepdf.Dictionary(Im0=xobject)),
                                  Contents=pikepdf.Stream(pdf, b"q 612 0 0 792 0 0 cm /Im0 Do Q"))  # fmt: skip
        pdf.pages.append(pikepdf.Page(page))
    out = io.BytesIO()
    pdf.save(out)
    return out.getvalue()


def page_result(number: int, lines: int) -> dict:
    rendered = [int(v * 200 / 72) for v in (612, 792)]  # the pod reads at 200 DPI
    texts = [" ".join(WORDS[(number + line + k) % len(WORDS)] for k in range(8)) for line in range(lines)]
    step = (rendered[1] - 200) // max(1, lines)
    return {"text": "\n".join(texts), "confidence": 90.0, "width": rendered[0], "height": rendered[1],
            "engine": "tesseract",
            "lines": [{"text": text, "bbox": [100, 100 + step * i, 100 + 18 * len(text), 100 + step * i + step * 2 // 3],
                       "confidence": 90.0} for i, text in enumerate(texts)]}  # fmt: skip


def make_document(pages: int, lines: int):
    """A job with the scanned PDF as its document, split, every page done with its result."""
    from django.contrib.auth.models import User

    from ocrjobs.models import Page
    from ocrjobs.services.pages import result_json
    from ocrjobs.services.split import document_split
    from ocrjobs.services.submission import Upload, job_submit

    data = scanned_pdf(pages)
    owner, _ = User.objects.get_or_create(username="bench")
    job = job_submit(owner=owner, uploads=[Upload(name=f"scan-{pages}.pdf", file=io.BytesIO(data))], pool_key="local")
    document = job.documents.get()
    document_split(document_id=document.pk)
    rows = list(Page.objects.filter(document=document).order_by("number"))
    for page in rows:
        page.status, page.result = Page.Status.DONE, result_json(page_result(page.number, lines))
    Page.objects.bulk_update(rows, ["status", "result"], batch_size=500)
    return document, data


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class _Heap(logging.Handler):
    """The C heap in use (glibc's mallinfo2: qpdf's objects, reportlab's, Python's larger ones)
    each time the build logs a chunk of pages done: {pages done: bytes}. Unlike the peak RSS it
    does not depend on when a sampler wakes, nor on what the allocator keeps after a free.
    ctypes because nothing public reports the C heap: tracemalloc sees only Python's allocations,
    not qpdf's, and psutil only the RSS. Benchmark only; if glibc's mallinfo2 goes away the
    constructor raises and tests/bench/test_searchable_pdf_memory.py fails."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        libc = ctypes.CDLL("libc.so.6")

        class Mallinfo2(ctypes.Structure):
            _fields_ = [(name, ctypes.c_size_t) for name in
                        "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]  # fmt: skip

        libc.mallinfo2.restype = Mallinfo2
        self._mallinfo, self.in_use = libc.mallinfo2, {}

    def emit(self, record: logging.LogRecord) -> None:
        if record.msg.endswith("layered"):
            info = self._mallinfo()
            self.in_use[record.args[-1]] = info.uordblks + info.hblkhd


def _growth_per_page(in_use: dict[int, int]) -> int | None:
    """Bytes a page the heap grew from the first checkpoint past a fifth of the pages to the last
    (the first chunks fill the caches that stay: the font, the database's)."""
    done = sorted(in_use)
    first = next((n for n in done[:-1] if n >= done[-1] // 5), None)
    return None if first is None else round((in_use[done[-1]] - in_use[first]) / (done[-1] - first))


def build(document) -> dict:
    """Build the document's searchable PDF as the worker does: CPU, wall, peak RSS growth, and
    the heap's growth a page between chunks."""
    from ocrjobs.services.searchable_pdf import searchable_pdf_build

    heap, logger = _Heap(), logging.getLogger("ocrjobs.services.searchable_pdf")
    logger.addHandler(heap)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    before, peak, done = _rss(), [0], threading.Event()

    def sample() -> None:
        while not done.wait(0.005):
            peak[0] = max(peak[0], _rss())

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    wall, cpu = time.perf_counter(), time.process_time()
    row = searchable_pdf_build(document_id=document.pk)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    done.set()
    sampler.join()
    logger.removeHandler(heap)
    logger.propagate = True
    assert row.status == row.Status.BUILT, row.error
    return {"cpu_s": round(cpu, 3), "wall_s": round(wall, 3), "peak_growth_mb": round(max(0, peak[0] - before) / 2**20, 1),
            "heap_growth_per_page_bytes": _growth_per_page(heap.in_use), "name": row.name}  # fmt: skip


def check(document, original: bytes, built_name: str, lines: int) -> tuple[float, bool]:
    """The lowest text match over sampled pages, and whether pages and sizes are the original's."""
    import pypdfium2 as pdfium

    from ocrjobs.storage import document_bytes

    built, source = pdfium.PdfDocument(document_bytes(built_name)), pdfium.PdfDocument(original)
    kept = len(built) == len(source) and all(built[i].get_size() == source[i].get_size() for i in range(len(source)))
    worst = 1.0
    for i in sorted({0, len(built) // 2, len(built) - 1}):
        extracted = built[i].get_textpage().get_text_bounded().replace("\r\n", "\n")
        expected = page_result(i + 1, lines)["text"]
        worst = min(worst, difflib.SequenceMatcher(None, extracted, expected, autojunk=False).ratio())
    return round(worst, 4), kept


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pages", type=int, default=1000)
    parser.add_argument("--lines", type=int, default=40)
    parser.add_argument("--database-url", default="")
    parser.add_argument("--pages-per-chunk", type=int, default=0,
                        help="the build's chunk (PAGES_PER_LAYER); default: the worker's, or a fifth of "
                        "--pages when that is smaller, so that the heap is read at five chunks at least")  # fmt: skip
    args = parser.parse_args()
    django_for_bench("searchable-pdf", database_url=args.database_url)
    from ocrjobs.services import searchable_pdf

    chunk = args.pages_per_chunk or min(searchable_pdf.PAGES_PER_LAYER, max(1, args.pages // 5))
    searchable_pdf.PAGES_PER_LAYER = chunk
    from django.db import connection

    tenth_document, _ = make_document(max(1, args.pages // 10), args.lines)
    document, original = make_document(args.pages, args.lines)
    tenth = build(tenth_document)
    full = build(document)
    match, kept = check(document, original, full["name"], args.lines)
    cpu_per_100 = round(full["cpu_s"] * 100 / args.pages, 3)
    figures = {"pages": args.pages, "pages_per_chunk": chunk, "lines_per_page": args.lines, "document_mb": round(len(original) / 2**20, 1),
               "cpu_s": full["cpu_s"], "wall_s": full["wall_s"], "cpu_s_per_100_pages": cpu_per_100,
               "peak_growth_mb": full["peak_growth_mb"], "tenth_peak_growth_mb": tenth["peak_growth_mb"],
               "heap_growth_per_page_bytes": full["heap_growth_per_page_bytes"], "text_match": match}  # fmt: skip
    print(f"{args.pages} pages ({figures['document_mb']} MB, {args.lines} lines a page): {full['cpu_s']} s of CPU "
          f"({cpu_per_100} s per 100 pages), {full['wall_s']} s wall; peak memory growth {full['peak_growth_mb']} MB "
          f"({tenth['peak_growth_mb']} MB for a tenth of the pages), the heap grew "
          f"{full['heap_growth_per_page_bytes']} bytes a page between chunks; text match {match}")  # fmt: skip
    # The build is a worker's task: its CPU is the control plane's, per page of the full build.
    cpu = per_unit("page", full["cpu_s"], args.pages, CPU_CEILING_MS_PER_PAGE)
    print(cpu_line(cpu))
    goal = {
        "text_matches": match >= 0.99,
        "pages_and_sizes_kept": kept,
        # CPU time, which the machine's load barely moves: a generous ceiling CI asserts.
        CEILING_GOAL: within_ceiling(cpu),
        "cpu_under_1s_per_100_pages": cpu_per_100 < 1.0,
        "memory_bounded": full["peak_growth_mb"] <= 2 * tenth["peak_growth_mb"] + 16,
        "heap_bounded_by_a_chunk": full["heap_growth_per_page_bytes"] is not None
        and full["heap_growth_per_page_bytes"] < HEAP_GROWTH_PER_PAGE_MAX,
    }
    print(json.dumps({"benchmark": "searchable_pdf", "database": connection.vendor, **figures, **cpu, "goal": goal,
                      "goal_met": all(goal.values())}))  # fmt: skip


if __name__ == "__main__":
    main()
