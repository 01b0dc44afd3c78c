"""The pod's answers, typed once, on the side that sends them: the pod server builds them, the
control plane (ocrjobs/dispatch/, pods/podclient.py) parses each once and reads attributes, never
a dict's keys.

Fields the pod server always sends are still optional here with a default: the control plane
stores readings that no pod made (a PDF's text layer, the cascade's) in the same shape. A field
that is present must have its type, and an answer that is not an object with a ``text`` is no
page's answer. Fields an engine adds beyond these (vlm: ``language``, ``tokens``) are kept as
they came (``extra="allow"``), and a parsed answer dumped with ``exclude_unset=True`` is what was
sent.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

Number = int | float  # a box's coordinates as the engine gave them: ints stay ints


class PageLine(BaseModel):
    """One line of a page: its text, its box in the page's pixels (None: the engine gives none,
    vlm), its confidence (0-100); with tesseract its baseline [x0, y0, x1, y1] and angle."""

    model_config = ConfigDict(extra="allow")

    text: str = ""
    bbox: list[Number] | None = None
    confidence: float | None = None
    baseline: list[Number] | None = None
    angle: float | None = None


class PageAnswer(BaseModel):
    """``POST /v1/ocr``'s 200: a page read (podserver/README.md, "The pod's API")."""

    model_config = ConfigDict(extra="allow")

    text: str
    lines: list[PageLine] = []
    confidence: float | None = None  # 0-100
    width: int | None = None  # the page's pixels, which the boxes are in
    height: int | None = None
    engine: str | None = None
    markdown: bool = False  # the text is Markdown (Engine.gives_markdown): shown and exported as it is
    seconds: float | None = None  # the engine's time
    render_seconds: float | None = None  # a cached document's page: its render
    dpi: int | None = None  # a PDF page: the DPI it was rendered at (an image has none)
    rotation: int | None = None  # tesseract: how far the text was turned clockwise
    skew: float | None = None
    warnings: list[str] = []


class DocumentStored(BaseModel):
    """``PUT /v1/documents/{sha256}``'s 200 or 201."""

    sha256: str
    bytes: int
    pages: int


class DocumentsHeld(BaseModel):
    count: int
    bytes: int
    capacity_bytes: int


class PodModels(BaseModel):
    """``GET /v1/models``: what the pod runs and how busy it is."""

    engine: str
    version: str
    device: str
    model: str
    languages: list[str]
    gives: list[str] = []  # of markdown, boxes, confidence (Engine.gives)
    lanes: int
    busy: int
    ready: bool
    name: str
    pages_done: int
    pages_failed: int
    documents: DocumentsHeld


class PodError(BaseModel):
    """Every answer but a 200 or 201 (and ``/healthz``): what went wrong, in a sentence."""

    model_config = ConfigDict(extra="allow")  # a 409 names its document too

    error: str
