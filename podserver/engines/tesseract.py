"""Tesseract, in the pod's own process through its C API (tesserocr), or else one tesseract
process per page (pytesseract).

Through the API a lane keeps its own loaded tesseract between pages and hands it the page's
pixels as they are: no PNG written and read back, no process started, no model loaded per page
(issue 27: what the embedded default paid against the bare engine). tesserocr's wheels bundle
libtesseract; the languages' data are the system's (the tesseract-ocr packages), found where the
``tesseract`` command finds them. Where tesserocr cannot be imported, or ``TESSERACT_API=false``,
pytesseract runs the command per page, killed at the page time limit.

The time limits differ: a command is killed at the limit; the API's recognition stops at
tesseract's own deadline, checked between words, so layout analysis (a fraction of a page's time)
runs on past it. A page's render, where a crafted PDF spends its minutes, is killed either way
(podserver/render.py).
"""

from __future__ import annotations

import os
import re
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

import pytesseract
from PIL import Image

from .base import Engine, PageTimeout, page_result, usable_cpus

# pytesseract's word table, from the same TSV the command writes (GetTSVText is that writer).
TSV_INTS = ("level", "page_num", "block_num", "par_num", "line_num", "word_num", "left", "top", "width", "height")


class TesseractEngine(Engine):
    name = "tesseract"

    def load(self) -> None:
        """Check the tesseract binary answers; note its version and installed languages."""
        if self.requested_device == "cuda":
            raise RuntimeError("tesseract runs on the CPU only; DEVICE=cuda asks for another engine")
        # Tesseract's OpenMP threads fight each other when several lanes run at once:
        # one thread per process is ~6x faster per page here. pytesseract passes
        # os.environ to every child, so setting it before the first call is enough.
        os.environ["OMP_THREAD_LIMIT"] = "1"
        try:
            self.version = str(pytesseract.get_tesseract_version())
        except SystemExit as exc:  # pytesseract exits on an unparsable version string
            raise RuntimeError(str(exc)) from None
        self.languages = sorted(pytesseract.get_languages())
        if not self.languages:
            raise RuntimeError("tesseract reports no installed languages")
        self.api = None
        if self.environ.get("TESSERACT_API", "true").lower() != "false":
            self.api = _api_pool(tessdata_dir())
        if self.api is not None:
            self.version = self.api.version  # libtesseract's, which reads the pages (the wheel's own)

    def suggested_lanes(self) -> int:
        return usable_cpus()  # one single-threaded tesseract per CPU

    def ocr(self, img: Image.Image, lang: str, timeout: float) -> dict[str, Any]:
        """OCR one page; PageTimeout past the limit, other exceptions are engine errors."""
        started = time.monotonic()
        if self.api is not None:
            data = self.api.read(img, lang, timeout)
        else:
            data = _read_with_command(img, lang, timeout)
        text, lines, confidence = group_words(data)
        return page_result(self.name, img, text, lines, confidence, started)


def _read_with_command(img: Image.Image, lang: str, timeout: float) -> dict[str, list]:
    try:
        return pytesseract.image_to_data(img, lang=lang, output_type=pytesseract.Output.DICT, timeout=timeout)
    except RuntimeError as exc:
        # pytesseract signals its own kill only through this message.
        if "timeout" in str(exc).lower():
            raise PageTimeout(str(exc)) from None
        raise


def tessdata_dir() -> str:
    """Where the tesseract command reads its languages (TESSDATA_PREFIX, or its built-in path)."""
    if os.environ.get("TESSDATA_PREFIX"):
        return os.environ["TESSDATA_PREFIX"]
    said = subprocess.run(["tesseract", "--list-langs"], capture_output=True, text=True, timeout=30)
    found = re.search(r'"([^"]+)"', said.stdout + said.stderr)
    if found is None:
        raise RuntimeError(f"tesseract --list-langs named no directory: {said.stdout!r} {said.stderr!r}")
    return found.group(1)


class _ApiPool:
    """Loaded tesseracts, one per lane and language at most: a lane takes one, reads a page with
    it and gives it back (an API is used by one thread at a time; tesserocr lets go of the GIL
    while it reads, so lanes read side by side)."""

    def __init__(self, tesserocr, path: str) -> None:
        self.tesserocr = tesserocr
        self.path = path
        self.version = tesserocr.tesseract_version().split()[1]
        self.idle: dict[str, list] = {}
        self.lock = threading.Lock()

    def _take(self, lang: str):
        with self.lock:
            if self.idle.get(lang):
                return self.idle[lang].pop()
        try:
            return self.tesserocr.PyTessBaseAPI(path=self.path, lang=lang)
        except RuntimeError as exc:
            raise RuntimeError(f"tesseract could not load {lang!r} from {self.path}: {exc}") from None

    def read(self, img: Image.Image, lang: str, timeout: float) -> dict[str, list]:
        if img.mode not in ("L", "RGB"):
            img = img.convert("RGB")
        bpp = 1 if img.mode == "L" else 3
        api = self._take(lang)
        try:
            pixels = img.tobytes()
            api.SetImageBytes(pixels, img.width, img.height, bpp, img.width * bpp)
            started = time.monotonic()
            if not api.Recognize(timeout=max(1, int(timeout * 1000))):
                if time.monotonic() - started >= timeout:
                    raise PageTimeout(f"tesseract ran past the page time limit of {timeout:g} s")
                raise RuntimeError("tesseract could not read the page")
            tsv = api.GetTSVText(0)
            api.Clear()
        except BaseException:
            api.End()  # a tesseract that failed is not kept for the next page
            raise
        with self.lock:
            self.idle.setdefault(lang, []).append(api)
        return parse_tsv(tsv)


def _api_pool(path: str) -> _ApiPool | None:
    """The API pool, or None where tesserocr is not installed."""
    try:
        import tesserocr
    except ImportError:
        return None
    return _ApiPool(tesserocr, path)


def parse_tsv(tsv: str) -> dict[str, list]:
    """Tesseract's TSV rows (no header, as GetTSVText writes them) as pytesseract's word table."""
    data: dict[str, list] = {key: [] for key in (*TSV_INTS, "conf", "text")}
    for row in tsv.splitlines():
        fields = row.split("\t")
        if len(fields) < 11:
            continue
        for key, value in zip(TSV_INTS, fields, strict=False):
            data[key].append(int(value))
        data["conf"].append(float(fields[10]))
        data["text"].append(fields[11] if len(fields) > 11 else "")
    return data


# A word tesseract reads at this confidence (0-100) or above counts as sure (page_confidence).
SURE_WORD = 90.0


def page_confidence(confidences: Sequence[float]) -> float:
    """The page's confidence (0-100, higher = surer): the share of its words that tesseract read
    at SURE_WORD or above, times 100; 0 for a page without words.

    Not the mean word confidence, which it was until issue 26: on a noisy page tesseract stays
    fairly sure of many words it gets wrong (pages read at 86-88 % character accuracy had means
    of 69-72, a clean page ~96), so the mean ranks pages less well, and a cascade's threshold acts
    on the ranking. On bench/cascade.py's 40 calibration pages (clean, noise, blur, low
    resolution, rotation), rank correlation (Spearman) with the page's character accuracy: this
    share 0.96, the mean 0.86, the share at 85 or above 0.96, at 70 0.85, the character-weighted
    mean 0.84, the lowest-decile word confidence 0.71, the share of plain words 0.77; with what
    reading the page with rapidocr instead gains, -0.77 against the mean's -0.64. On its 60
    evaluation pages 0.94 against 0.88. Lines keep their mean word confidence."""
    if not confidences:
        return 0.0
    return 100.0 * sum(1 for conf in confidences if conf >= SURE_WORD) / len(confidences)


def group_words(
    data: Mapping[str, Sequence[Any]],
) -> tuple[str, list[dict[str, Any]], float]:
    """Turn tesseract's word table into (page text, lines, page confidence: page_confidence)."""
    grouped: dict[tuple[int, int, int], list[int]] = {}
    confidences: list[float] = []
    for i, word in enumerate(data.get("text", ())):
        conf = float(data["conf"][i])
        # conf -1 rows are page/block/paragraph/line containers, not words.
        if conf == -1 or not str(word).strip():
            continue
        key = (
            int(data["block_num"][i]),
            int(data["par_num"][i]),
            int(data["line_num"][i]),
        )
        grouped.setdefault(key, []).append(i)  # dicts keep tesseract's reading order
        confidences.append(conf)

    lines: list[dict[str, Any]] = []
    parts: list[str] = []
    previous_par: tuple[int, int] | None = None
    for (block, par, _line), idx in grouped.items():
        x0 = min(int(data["left"][i]) for i in idx)
        y0 = min(int(data["top"][i]) for i in idx)
        x1 = max(int(data["left"][i]) + int(data["width"][i]) for i in idx)
        y1 = max(int(data["top"][i]) + int(data["height"][i]) for i in idx)
        line_text = " ".join(str(data["text"][i]).strip() for i in idx)
        line_conf = sum(float(data["conf"][i]) for i in idx) / len(idx)
        lines.append(
            {
                "text": line_text,
                "bbox": [x0, y0, x1, y1],
                "confidence": round(line_conf, 2),
            }
        )
        if previous_par is not None and previous_par != (block, par):
            parts.append("")  # blank line marks a paragraph or block break
        parts.append(line_text)
        previous_par = (block, par)

    return "\n".join(parts), lines, round(page_confidence(confidences), 2)
