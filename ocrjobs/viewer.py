"""Reads for the job page's page viewer: each page with its lines, their boxes placed as shares of
the page's pixel size (what the pod rendered it at), and their confidence against the threshold.

Pages with a line whose confidence is under ``VIEWER_CONFIDENCE_THRESHOLD`` come first ("to
check": ``Page.min_line_confidence``, or the page's own confidence when no line gives one), then
the rest, each group in document and page order. A corrected line is checked. A batch is ``VIEWER_BATCH`` pages: the browser asks
for the next one as the last comes into view, so a page of a 3,000-page job reads 25 results.
The control plane never renders a page (DESIGN invariant 16): the browser draws a PDF's pages
(pdf.js) and shows an image as it is; this module only says where the boxes go.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from django.db.models import Case, Count, Q, QuerySet, Value, When

from ocrjobs.models import Document, Job, Page
from ocrjobs.results import StoredResult

VIEWER_BATCH = 25
# Images a browser shows as they are; a TIFF (or anything else) gets its text without the page.
BROWSER_IMAGES = {".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".gif": "image/gif",
                  ".webp": "image/webp", ".bmp": "image/bmp"}  # fmt: skip


@dataclass
class ViewerLine:
    number: int
    text: str
    confidence: float | None
    band: str  # low (under the threshold), fair, good, unknown
    box: list[float] | None  # left, top, width, height: percent of the page's width and height
    engine_text: str | None = None  # the engine's reading, when a person corrected the line

    @property
    def to_check(self) -> bool:
        return self.band == "low" and self.engine_text is None

    def to_dict(self) -> dict:
        """The line for the browser; ``engine`` and ``check`` only when they say something (25
        pages of 40 lines each: 40 kB of HTML less than with them always)."""
        line = {"n": self.number, "text": self.text, "conf": self.confidence, "band": self.band, "box": self.box}
        if self.engine_text is not None:
            line["engine"] = self.engine_text
        if self.to_check:
            line["check"] = True
        return line


@dataclass
class ViewerPage:
    page: Page
    to_check: bool
    text: str
    lines: list[ViewerLine] = field(default_factory=list)
    width: int | None = None
    height: int | None = None
    dpi: int | None = None
    engine: str = ""
    markdown: bool = False  # its text is Markdown (tables as HTML, equations as LaTeX): its answer said so
    source: str = ""  # "pdf", "image" (shown as it is) or "" (nothing a browser shows)
    escalated: bool = False  # read again in an escalation pool, or waiting there
    stages: list[dict] = field(default_factory=list)  # a cascade's: pool, engine, confidence, why not read
    warnings: list[str] = field(default_factory=list)  # why its reading is not to be trusted as it is
    rotation: int = 0  # how far its text was turned clockwise (read upright; its boxes are on the page as shown)
    skew: float = 0.0

    @property
    def lines_to_check(self) -> int:
        return sum(line.to_check for line in self.lines)

    @property
    def boxed(self) -> bool:
        return any(line.box for line in self.lines)

    @property
    def lines_id(self) -> str:
        return f"viewer-lines-{self.page.pk}"

    @property
    def lines_data(self) -> list[dict]:
        """The lines for the browser (a json_script): it builds their boxes and list once the page
        comes into view, as cheap as a template is not (40 lines of 25 pages: 210 ms of templates)."""
        return [line.to_dict() for line in self.lines]


def confidence_band(confidence: float | None, threshold: float) -> str:
    """Under the threshold is "low"; from it to halfway to 100 "fair"; above that "good"."""
    if confidence is None:
        return "unknown"
    if confidence < threshold:
        return "low"
    return "fair" if confidence < (threshold + 100) / 2 else "good"


def _to_check(threshold: float) -> Q:
    """A page read with a line under the threshold; one whose lines give no confidence, by its own."""
    by_lines = Q(min_line_confidence__lt=threshold)
    by_page = Q(min_line_confidence=None, confidence__lt=threshold)
    return Q(status=Page.Status.DONE) & (by_lines | by_page)


def page_to_check(page: Page, threshold: float) -> bool:
    """_to_check for one page in hand."""
    if page.status != Page.Status.DONE:
        return False
    lowest = page.min_line_confidence if page.min_line_confidence is not None else page.confidence
    return lowest is not None and lowest < threshold


def viewer_pages(job: Job, *, threshold: float, only_to_check: bool = False) -> QuerySet[Page]:
    """The job's pages in the viewer's order: those to check first."""
    pages = job.pages.annotate(check_first=Case(When(_to_check(threshold), then=Value(0)), default=Value(1)))
    if only_to_check:
        pages = pages.filter(_to_check(threshold))
    return pages.order_by("check_first", "document__position", "number")


def viewer_counts(job: Job, *, threshold: float) -> dict[str, int]:
    return job.pages.aggregate(total=Count("id"), to_check=Count("id", filter=_to_check(threshold)))


def viewer_lines_to_check(job: Job, *, threshold: float) -> int:
    """The job's lines under the threshold, not corrected: only the pages to check are read (the
    viewer asks for it once its first page is shown; a first load reads one batch's results)."""
    rows = job.pages.filter(_to_check(threshold)).order_by().values_list("result", flat=True)
    lines = 0
    for result in rows.iterator(chunk_size=200):
        for line in (StoredResult.from_json(result) or StoredResult()).lines:
            confidence = line.get("confidence")
            if isinstance(confidence, int | float) and confidence < threshold and "engine_text" not in line:
                lines += 1
    return lines


def viewer_batch(
    job: Job, *, threshold: float, only_to_check: bool = False, offset: int = 0, limit: int = VIEWER_BATCH
) -> tuple[list[ViewerPage], int | None]:
    """One batch of the viewer's pages from ``offset`` and the offset of the next (None: the last)."""
    # The order is found on the ids alone, then the batch's rows are read: sorting whole rows
    # carried every page's result through the sort (SQLite, the last of 120 batches of a
    # 3,000-page job: 133 ms of CPU; the ids alone: see bench/viewer.py).
    pages = viewer_pages(job, threshold=threshold, only_to_check=only_to_check)
    ids = list(pages.values_list("pk", flat=True)[offset : offset + limit + 1])
    more = len(ids) > limit
    rows = Page.objects.select_related("document").in_bulk(ids[:limit])
    return [viewer_page(rows[pk], threshold=threshold) for pk in ids[:limit]], offset + limit if more else None


def _box(bbox, width: int, height: int) -> list[float] | None:
    """A line's [x0, y0, x1, y1] in the page's pixels as percent of its width and height."""
    if not isinstance(bbox, list | tuple) or len(bbox) != 4:
        return None
    try:
        x0, y0, x1, y1 = (float(v) for v in bbox)
    except (TypeError, ValueError):
        return None
    x0, x1 = max(0.0, min(x0, x1)), min(float(width), max(x0, x1))
    y0, y1 = max(0.0, min(y0, y1)), min(float(height), max(y0, y1))
    if x1 <= x0 or y1 <= y0:
        return None
    return [round(100 * x0 / width, 3), round(100 * y0 / height, 3),
            round(100 * (x1 - x0) / width, 3), round(100 * (y1 - y0) / height, 3)]  # fmt: skip


def _positive_int(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def document_source(document: Document) -> str:
    """What the browser can show of a document: "pdf", "image", or "" (a TIFF, a URL not fetched)."""
    if not document.source:
        return ""
    if document.kind == Document.Kind.PDF:
        return "pdf"
    if document.kind == Document.Kind.IMAGE and image_type(document) is not None:
        return "image"
    return ""


def image_type(document: Document) -> str | None:
    name = document.source or document.name
    return BROWSER_IMAGES.get(name[name.rfind(".") :].lower()) if "." in name else None


def cascade_stages(result: StoredResult) -> list[dict]:
    """The stages of a page read in a cascade (issue 26), as the viewer shows them: each pool, its
    engine and confidence, or why it gave no reading (an error, or the job's budget spent)."""
    return [
        {
            "pool": str(stage.get("pool") or ""),
            "engine": str(stage.get("engine") or ""),
            "confidence": stage.get("confidence") if isinstance(stage.get("confidence"), int | float) else None,
            "unread": str(stage.get("skipped") or stage.get("error") or ""),
        }
        for stage in result.cascade or []
    ]


def viewer_page(page: Page, *, threshold: float) -> ViewerPage:
    item = ViewerPage(
        page=page, to_check=page_to_check(page, threshold), text="", source=document_source(page.document)
    )
    result = StoredResult.from_row(page)
    item.escalated = result.escalated if result else page.escalated_from_id is not None
    if not result:
        return item
    item.stages = cascade_stages(result)
    item.text = result.text
    item.engine = result.engine or ""
    item.markdown = result.markdown
    item.width, item.height = _positive_int(result.width), _positive_int(result.height)
    item.dpi = _positive_int(result.dpi)
    item.warnings = result.warnings
    item.rotation = result.rotation if result.rotation in (90, 180, 270) else 0
    item.skew = float(result.skew) if result.skew is not None else 0.0
    if page.document.kind == Document.Kind.IMAGE and page.number > 1:
        item.source = ""  # a frame past the first (TIFF): the browser shows only the first
    for number, line in enumerate(result.lines):
        confidence = line.get("confidence")
        confidence = float(confidence) if isinstance(confidence, int | float) else None
        box = _box(line.get("bbox"), item.width, item.height) if item.width and item.height else None
        band = confidence_band(confidence, threshold)
        engine_text = str(line["engine_text"]) if "engine_text" in line else None
        item.lines.append(ViewerLine(number, str(line.get("text") or ""), confidence, band, box, engine_text))
    return item
