"""A document's reading as hOCR and ALTO XML (issue 40, item 5): what digitisation libraries,
their viewers (Mirador, the Internet Archive's BookReader, Goobi) and their search index read.

Made from the stored page results on request, a page at a time as the rows come (a chunk of
``ROWS_PER_QUERY``), and written by the standard library's XMLGenerator, which escapes every text
and attribute: a download holds one chunk of rows, never the document.

Coordinates are the pixels the pod read the page at (``width``, ``height``, each line's
``bbox``), as result.jsonl gives them. Results carry a box per line, not per word: a word's box
is its share of its line's box by characters, along the line's direction (its baseline's angle:
a line on its side is parted down or up the page), and its confidence is its line's. A line
without a box (the ``vlm`` engine's) is given a band of the page, as the searchable PDF stacks
them.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from xml.sax.saxutils import XMLGenerator

from ocrjobs.models import Document, Page
from ocrjobs.results import StoredResult
from ocrjobs.services.outputs import ROWS_PER_QUERY

ALTO_NS = "http://www.loc.gov/standards/alto/ns-v4#"
ALTO_SCHEMA = "http://www.loc.gov/standards/alto/v4/alto-4-2.xsd"
XHTML_NS = "http://www.w3.org/1999/xhtml"
SOFTWARE = "fleetadmin"

Box = tuple[int, int, int, int]


# --- the page's lines and words, in pixels -------------------------------------------------------


def _pages(document: Document) -> Iterator[tuple[int, StoredResult]]:
    """(number, result) of each page in order; a page not read has an empty result."""
    rows = document.pages.order_by("number").values_list("number", "status", "result")
    for number, status, result in rows.iterator(chunk_size=ROWS_PER_QUERY):
        read = StoredResult.from_json(result) if status == Page.Status.DONE else None
        yield number, read or StoredResult()


def _size(result: StoredResult) -> tuple[int, int] | None:
    if result.width is None or result.height is None:
        return None
    width, height = int(result.width), int(result.height)
    return (width, height) if width > 0 and height > 0 else None


def _line_box(line: dict, index: int, count: int, size: tuple[int, int]) -> Box:
    box = line.get("bbox")
    try:
        x0, y0, x1, y1 = (max(0, round(float(v))) for v in box)
        if x1 > x0 and y1 > y0:
            return x0, y0, x1, y1
    except (TypeError, ValueError):
        pass
    width, height = size  # no box: a band of the page, in reading order
    band = height // max(count, 1)
    return 0, index * band, width, max(index * band + 1, (index + 1) * band)


def _direction(line: dict) -> int:
    """The way the line's text runs: 0 left to right, 90 up the page, 180 right to left, 270 down."""
    try:
        angle = float(line.get("angle") or 0.0)
    except (TypeError, ValueError):
        angle = 0.0
    return round(angle / 90) % 4 * 90


def _word_boxes(text: str, box: Box, direction: int) -> Iterator[tuple[str, Box]]:
    """Each word of the line with its share of the line's box, by characters."""
    x0, y0, x1, y1 = box
    length = max(len(text), 1)
    start = 0
    for word in text.split():
        start = text.index(word, start)
        a, b = start / length, (start + len(word)) / length
        start += len(word)
        if direction == 0:
            yield word, (x0 + round(a * (x1 - x0)), y0, max(x0 + round(b * (x1 - x0)), x0 + 1), y1)
        elif direction == 180:
            yield word, (x1 - round(b * (x1 - x0)), y0, max(x1 - round(a * (x1 - x0)), x0 + 1), y1)
        elif direction == 90:
            yield word, (x0, y1 - round(b * (y1 - y0)), x1, max(y1 - round(a * (y1 - y0)), y0 + 1))
        else:
            yield word, (x0, y0 + round(a * (y1 - y0)), x1, max(y0 + round(b * (y1 - y0)), y0 + 1))


def _lines(result: StoredResult, size: tuple[int, int]) -> list[tuple[dict, Box, float | None]]:
    lines = result.lines_or_text()
    read = []
    for index, line in enumerate(lines):
        confidence = line.get("confidence", result.confidence)
        try:
            confidence = min(100.0, max(0.0, float(confidence)))
        except (TypeError, ValueError):
            confidence = None
        read.append((line, _line_box(line, index, len(lines), size), confidence))
    return read


def _union(boxes: list[Box]) -> Box:
    return min(b[0] for b in boxes), min(b[1] for b in boxes), max(b[2] for b in boxes), max(b[3] for b in boxes)


class _Writer:
    """An XMLGenerator over a buffer that is taken as text after each page."""

    def __init__(self) -> None:
        self.buffer = io.StringIO()
        self.xml = XMLGenerator(self.buffer, encoding="utf-8", short_empty_elements=True)

    def start(self, tag: str, **attributes) -> None:
        """``class_`` is written ``class``, ``xml__lang`` ``xml:lang``."""
        self.xml.startElement(tag, {k.rstrip("_").replace("__", ":"): str(v) for k, v in attributes.items()})

    def end(self, tag: str) -> None:
        self.xml.endElement(tag)

    def empty(self, tag: str, **attributes) -> None:
        self.start(tag, **attributes)
        self.end(tag)

    def text(self, text: str) -> None:
        self.xml.characters(text)

    def leaf(self, tag: str, text: str) -> None:
        """An element holding only ``text``."""
        self.start(tag)
        self.text(text)
        self.end(tag)

    def take(self) -> str:
        text = self.buffer.getvalue()
        self.buffer.seek(0)
        self.buffer.truncate()
        return text


# --- hOCR ----------------------------------------------------------------------------------------


def _bbox(box: Box) -> str:
    return "bbox " + " ".join(str(v) for v in box)


def document_hocr(document: Document) -> Iterator[str]:
    """The document as hOCR 1.2: an ``ocr_page`` a page (pages not read are empty, their title
    says why), each line an ``ocr_line``, each word an ``ocrx_word`` with its box and
    ``x_wconf``."""
    out = _Writer()
    yield '<?xml version="1.0" encoding="UTF-8"?>\n'
    yield '<!DOCTYPE html PUBLIC "-//W3C//DTD XHTML 1.0 Transitional//EN" '
    yield '"http://www.w3.org/TR/xhtml1/DTD/xhtml1-transitional.dtd">\n'
    out.start("html", xmlns=XHTML_NS, xml__lang="en", lang="en")
    out.start("head")
    out.leaf("title", document.name)
    out.empty("meta", name="ocr-system", content=SOFTWARE)
    out.empty("meta", name="ocr-capabilities", content="ocr_page ocr_line ocrx_word")
    out.end("head")
    out.start("body")
    yield out.take()
    for number, result in _pages(document):
        size = _size(result)
        title = f'image "{_title_text(document.name)}"; ppageno {number - 1}'
        if size is None:
            out.empty("div", class_="ocr_page", id=f"page_{number}", title=title)
            yield out.take() + "\n"
            continue
        out.start("div", class_="ocr_page", id=f"page_{number}", title=f"{title}; {_bbox((0, 0, *size))}")
        for index, (line, box, confidence) in enumerate(_lines(result, size), start=1):
            line_id = f"line_{number}_{index}"
            direction = _direction(line)
            angle = f"; textangle {direction}" if direction else ""
            out.start("span", class_="ocr_line", id=line_id, title=f"{_bbox(box)}{angle}")
            for word_index, (word, word_box) in enumerate(_word_boxes(str(line["text"]), box, direction), start=1):
                if word_index > 1:
                    out.text(" ")
                wconf = f"; x_wconf {round(confidence)}" if confidence is not None else ""
                out.start("span", class_="ocrx_word", id=f"word_{number}_{index}_{word_index}",
                          title=f"{_bbox(word_box)}{wconf}")  # fmt: skip
                out.text(word)
                out.end("span")
            out.end("span")
            out.text("\n")
        out.end("div")
        yield out.take() + "\n"
    out.end("body")
    out.end("html")
    yield out.take() + "\n"


def _title_text(name: str) -> str:
    """A name inside a title's double-quoted property (hOCR's own quoting)."""
    return name.replace("\\", "\\\\").replace('"', '\\"')


# --- ALTO ----------------------------------------------------------------------------------------


def _position(box: Box) -> dict[str, int]:
    x0, y0, x1, y1 = box
    return {"HPOS": x0, "VPOS": y0, "WIDTH": x1 - x0, "HEIGHT": y1 - y0}


def document_alto(document: Document) -> Iterator[str]:
    """The document as ALTO v4: a ``Page`` a page (in pixels, ``MeasurementUnit``), its lines in
    one ``TextBlock`` of its ``PrintSpace``, each word a ``String`` with its position and ``WC``
    (0-1), ``SP`` between words. A page not read is an empty Page."""
    out = _Writer()
    yield '<?xml version="1.0" encoding="UTF-8"?>\n'
    out.start("alto", xmlns=ALTO_NS, xmlns__xsi="http://www.w3.org/2001/XMLSchema-instance",
              xsi__schemaLocation=f"{ALTO_NS} {ALTO_SCHEMA}")  # fmt: skip
    out.start("Description")
    out.leaf("MeasurementUnit", "pixel")
    out.start("sourceImageInformation")
    out.leaf("fileName", document.name)
    out.end("sourceImageInformation")
    out.start("OCRProcessing", ID="ocr_1")
    out.start("ocrProcessingStep")
    out.start("processingSoftware")
    out.leaf("softwareName", SOFTWARE)
    out.end("processingSoftware")
    out.end("ocrProcessingStep")
    out.end("OCRProcessing")
    out.end("Description")
    out.start("Layout")
    yield out.take() + "\n"
    for number, result in _pages(document):
        size = _size(result)
        page = {"ID": f"page_{number}", "PHYSICAL_IMG_NR": number}
        if size is None:
            out.empty("Page", **page)
            yield out.take() + "\n"
            continue
        lines = _lines(result, size)
        confidence = result.confidence
        if confidence is not None:
            page["PC"] = f"{min(1.0, max(0.0, confidence / 100)):.2f}"
        out.start("Page", **page, WIDTH=size[0], HEIGHT=size[1])
        out.start("PrintSpace", **_position((0, 0, *size)))
        if lines:
            out.start("TextBlock", ID=f"block_{number}", **_position(_union([box for _, box, _ in lines])))
            for index, (line, box, line_confidence) in enumerate(lines, start=1):
                _alto_line(out, number, index, line, box, line_confidence)
            out.end("TextBlock")
        out.end("PrintSpace")
        out.end("Page")
        yield out.take() + "\n"
    out.end("Layout")
    out.end("alto")
    yield out.take() + "\n"


def _alto_line(out: _Writer, number: int, index: int, line: dict, box: Box, confidence: float | None) -> None:
    direction = _direction(line)  # (the words' order along it; ALTO's TextLine has no rotation of its own)
    out.start("TextLine", ID=f"line_{number}_{index}", **_position(box))
    for word_index, (word, word_box) in enumerate(_word_boxes(str(line["text"]), box, direction), start=1):
        if word_index > 1:
            out.empty("SP")
        wc = {"WC": f"{confidence / 100:.2f}"} if confidence is not None else {}
        out.empty("String", ID=f"string_{number}_{index}_{word_index}", CONTENT=word, **_position(word_box), **wc)
    out.end("TextLine")
