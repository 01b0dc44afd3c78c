"""What every OCR engine of the pod server offers, and the shape of a page's answer.

An engine loads once (``load``: raise to keep the pod unready, with the reason on /healthz) and
then reads pages from several lanes at once (``ocr`` is called from one thread per lane).
Every answer has the same keys whatever the engine: text, lines (text, bbox or None,
confidence), confidence (0-100), width, height, engine, seconds.
"""

from __future__ import annotations

import os
import time
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


class Engine:
    name: ClassVar[str]

    def __init__(self, *, model: str = "", device: str = "auto", environ: Mapping[str, str] | None = None) -> None:
        self.model = model
        self.requested_device = device
        self.device = "cpu"
        self.environ = environ or {}
        self.version = ""
        self.languages: list[str] = []

    def load(self) -> None:
        raise NotImplementedError

    def ocr(self, img: Image.Image, lang: str, timeout: float) -> dict[str, Any]:
        raise NotImplementedError

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
    engine: str,
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
        "engine": engine,
        "seconds": round(time.monotonic() - started, 3),
        **extra,
    }
