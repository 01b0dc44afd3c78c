"""What every OCR engine of the pod server offers, and the shape of a page's answer.

An engine loads once (``load``: raise to keep the pod unready, with the reason on /healthz) and
then reads pages from several lanes at once (``ocr`` is called from one thread per lane).
Every answer has the same keys whatever the engine: text, lines (text, bbox or None,
confidence), confidence (0-100), width, height, engine, markdown, seconds.

``Engine`` is the contract (as OCRmyPDF's ``OcrEngine``): an engine that leaves out a method or
one of the facts it declares cannot be made. The facts travel to the control plane with each page
(``markdown``) and in ``/v1/models`` (``gives``), so that it never asks an engine's name.
"""

from __future__ import annotations

import os
import time
from abc import ABC, abstractmethod
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from PIL import Image

# Tesseract's language codes are the pod's vocabulary (the control plane sends "eng+deu");
# an engine with a multilingual model accepts those its model covers.
LATIN_AND_CJK = {
    "eng": "en", "deu": "de", "fra": "fr", "spa": "es", "ita": "it", "nld": "nl", "por": "pt",
    "pol": "pl", "ces": "cs", "slk": "sk", "slv": "sl", "hrv": "hr", "hun": "hu", "ron": "ro",
    "dan": "da", "swe": "sv", "nor": "no", "fin": "fi", "est": "et", "lav": "lv", "lit": "lt",
    "cat": "ca", "tur": "tr", "vie": "vi", "ind": "id", "msa": "ms", "chi_sim": "ch",
    "chi_tra": "chinese_cht", "jpn": "japan",
}  # fmt: skip


class PageTimeout(Exception):
    """The engine ran past the page time limit."""


class Engine(ABC):
    name: ClassVar[str]

    def __init__(self, *, model: str = "", device: str = "auto", environ: Mapping[str, str] | None = None) -> None:
        self.model = model
        self.requested_device = device
        self.device = "cpu"
        self.environ = environ or {}
        self.version = ""
        self.languages: list[str] = []

    # What the engine gives: a subclass states each as a class attribute (``gives_markdown =
    # False``), or it cannot be made.
    @property
    @abstractmethod
    def gives_markdown(self) -> bool:
        """Its text is Markdown (tables as HTML, equations as LaTeX), shown and exported as it is."""

    @property
    @abstractmethod
    def gives_boxes(self) -> bool:
        """Its lines have boxes on the page (False: ``bbox`` is None, lines are stacked)."""

    @property
    @abstractmethod
    def gives_confidence(self) -> bool:
        """Its lines have a confidence of their own (False: the page's, repeated)."""

    @abstractmethod
    def load(self) -> None:
        """Load once; raise to keep the pod unready, with the reason on /healthz."""

    @abstractmethod
    def ocr(self, img: Image.Image, lang: str, timeout: float) -> dict[str, Any]:
        """Read one page (from one thread per lane): its answer, built with ``page_result``;
        PageTimeout past ``timeout``."""

    def gives(self) -> list[str]:
        """What it gives, as ``/v1/models`` reports it."""
        facts = {"markdown": self.gives_markdown, "boxes": self.gives_boxes, "confidence": self.gives_confidence}
        return [fact for fact, given in facts.items() if given]

    def suggested_lanes(self) -> int:
        """Pages to read at once on this machine (LANES=auto), once loaded."""
        return 1


def usable_cpus() -> int:
    """CPUs this process may use: its affinity, capped by a cgroup v2 quota (a container's vCPUs)."""
    cpus = len(os.sched_getaffinity(0))
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()
        if quota != "max":
            cpus = min(cpus, max(1, int(quota) // int(period)))
    except (OSError, ValueError):
        pass
    return cpus


def page_result(
    engine: Engine,
    img: Image.Image,
    text: str,
    lines: list[dict[str, Any]],
    confidence: float,
    started: float,
    **extra: Any,
) -> dict[str, Any]:
    return {
        "text": text,
        "lines": lines,
        "confidence": round(confidence, 2),
        "width": img.width,
        "height": img.height,
        "engine": engine.name,
        "markdown": engine.gives_markdown,
        "seconds": round(time.monotonic() - started, 3),
        **extra,
    }
