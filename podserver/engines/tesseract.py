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

from .. import orientation
from .base import Engine, PageTimeout, page_result, usable_cpus

# pytesseract's word table, from the same TSV the command writes (GetTSVText is that writer).
TSV_INTS = ("level", "page_num", "block_num", "par_num", "line_num", "word_num", "left", "top", "width", "height")


class TesseractEngine(Engine):
    name = "tesseract"
    gives_markdown = False
    gives_boxes = True
    gives_confidence = True

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
        """OCR one page; PageTimeout past the limit, other exceptions are engine errors.

        A page read at a confidence under ORIENTATION_CHECK_BELOW has its orientation detected
        (tesseract's OSD) and, if still read poorly, its skew (a projection profile); a page found
        turned or skewed is read again upright and level, and the better reading kept, its lines
        put back on the page as given (podserver/orientation.py). An upright page read well pays
        nothing for this."""
        started = time.monotonic()

        def left() -> float:
            return timeout - (time.monotonic() - started)

        text, lines, confidence = self._read(img, lang, timeout)
        upright, turned, unknown = img, 0, False
        # A blank page (no words) is a page, not a page read wrong: no orientation to find.
        if lines and confidence < ORIENTATION_CHECK_BELOW and "osd" in self.languages:
            found = self._detect_orientation(img, max(0.001, left()))
            unknown = found is None
            if found and left() > 0:
                candidate = orientation.turn(img, found)
                again = self._read_again(candidate, lang, left())
                if again and again[2] > confidence:
                    (text, lines, confidence), upright, turned = again, candidate, found
        # Tesseract levels a few degrees itself, but not always: single-spaced long lines at -3°
        # came out as nothing at all, at -2° as half as many lines, each two lines' words mixed
        # (read at 97). A page whose lines slope DESKEW_FROM_DEGREES or more, or that is still read
        # poorly (its skew then found from its ink), is read again level.
        _, measured = orientation.page_orientation(orientation.with_angles(lines))
        correction = 0.0
        if abs(measured) >= DESKEW_FROM_DEGREES:
            correction = -measured
        elif confidence < ORIENTATION_CHECK_BELOW and left() > 0:
            correction = orientation.skew_correction(upright)
        if correction and left() > 0:
            straight = orientation.straighten(upright, correction)
            again = self._read_again(straight, lang, left())
            if again and again[2] >= confidence:
                text, lines, confidence = again
                lines = orientation.lines_unskewed(lines, correction, straight.size, upright.size)
        lines = orientation.with_angles(orientation.lines_back(lines, turned, img.width, img.height))
        rotation, skew = orientation.page_orientation(lines, fallback=turned)
        warnings = []
        if unknown and confidence < ORIENTATION_CHECK_BELOW:
            warnings.append("orientation unknown: too little text to tell which way up the page is")
        return page_result(self, img, text, lines, confidence, started, rotation=rotation, skew=skew, warnings=warnings)

    def _read(self, img: Image.Image, lang: str, timeout: float) -> tuple[str, list[dict[str, Any]], float]:
        if self.api is not None:
            data, baselines = self.api.read(img, lang, timeout)
        else:
            data, baselines = _read_with_command(img, lang, timeout), None
        return group_words(data, baselines)

    def _read_again(
        self, img: Image.Image, lang: str, timeout: float
    ) -> tuple[str, list[dict[str, Any]], float] | None:
        """A second reading (turned upright, or level), or None past the page's time limit: the
        page keeps its first reading rather than failing for the time a second one took."""
        try:
            return self._read(img, lang, timeout)
        except PageTimeout:
            return None

    def _detect_orientation(self, img: Image.Image, timeout: float) -> int | None:
        """How far to turn the page counter-clockwise to have it upright (0, 90, 180, 270), by
        tesseract's orientation and script detection; None when it cannot tell (too little text)."""
        if self.api is not None:
            return self.api.orientation(img)
        try:
            found = pytesseract.image_to_osd(img, output_type=pytesseract.Output.DICT, timeout=timeout)
        except pytesseract.TesseractError:
            return None  # "Too few characters"
        except RuntimeError as exc:
            if "timeout" in str(exc).lower():
                raise PageTimeout(str(exc)) from None
            raise
        return int(found["orientation"]) % 360


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
            if lang == OSD:
                return self.tesserocr.PyTessBaseAPI(path=self.path, lang="osd", psm=self.tesserocr.PSM.OSD_ONLY)
            return self.tesserocr.PyTessBaseAPI(path=self.path, lang=lang)
        except RuntimeError as exc:
            raise RuntimeError(f"tesseract could not load {lang!r} from {self.path}: {exc}") from None

    def _give_back(self, lang: str, api) -> None:
        with self.lock:
            self.idle.setdefault(lang, []).append(api)

    def read(self, img: Image.Image, lang: str, timeout: float) -> tuple[dict[str, list], dict[tuple, list[int]]]:
        """The page's word table, and its lines' baselines by their boxes."""
        api = self._take(lang)
        try:
            _set_image(api, img)
            started = time.monotonic()
            if not api.Recognize(timeout=max(1, int(timeout * 1000))):
                if time.monotonic() - started >= timeout:
                    raise PageTimeout(f"tesseract ran past the page time limit of {timeout:g} s")
                raise RuntimeError("tesseract could not read the page")
            tsv = api.GetTSVText(0)
            baselines = _baselines(api, self.tesserocr.RIL.TEXTLINE)
            api.Clear()
        except BaseException:
            api.End()  # a tesseract that failed is not kept for the next page
            raise
        self._give_back(lang, api)
        return parse_tsv(tsv), baselines

    def orientation(self, img: Image.Image) -> int | None:
        """OSD's counter-clockwise turn to upright, or None when it cannot tell."""
        api = self._take(OSD)
        try:
            _set_image(api, img)
            found = api.DetectOrientationScript()
            api.Clear()
        except RuntimeError:
            found = None  # too few characters: the API is fine, the page says too little
            api.Clear()
        except BaseException:
            api.End()
            raise
        self._give_back(OSD, api)
        if not found or found.get("orient_conf", 0) <= 0:
            return None
        return int(found["orient_deg"]) % 360


# The pool's key for the APIs that detect orientation (no language's name).
OSD = "+osd"


def _set_image(api, img: Image.Image) -> None:
    if img.mode not in ("L", "RGB"):
        img = img.convert("RGB")
    bpp = 1 if img.mode == "L" else 3
    api.SetImageBytes(img.tobytes(), img.width, img.height, bpp, img.width * bpp)


def _baselines(api, level) -> dict[tuple, list[int]]:
    """Each text line's baseline [x0, y0, x1, y1], by the line's box (left, top, right, bottom):
    the box the TSV's line rows carry, so ``group_words`` finds each line's own."""
    found: dict[tuple, list[int]] = {}
    lines = api.GetIterator()
    if lines is None:
        return found
    while True:
        box, baseline = lines.BoundingBox(level), lines.Baseline(level)
        if box and baseline:
            found[tuple(box)] = [*baseline[0], *baseline[1]]
        if not lines.Next(level):
            return found


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


# A word tesseract reads at this confidence or above is one it is sure of. The page's confidence is
# the share of its words it is sure of (0-100): on bench/cascade.py's degraded pages it ranks the
# pages by their accuracy far better than the mean word confidence did (Spearman 0.92 against
# 0.68-0.73 over 100 pages of each of two seeds: noise leaves many words at 60-85, confident-looking
# on average while wrong), which is what a cascade's threshold and the viewer's "to check" need.
SURE_WORD_CONFIDENCE = 90.0


# A page read at a confidence under this has its orientation detected (tesseract's OSD, ~0.2 s
# of CPU on a 200 DPI letter page, against ~0.6 s for its reading): an upright page read well
# (bench/local.py's pages: 95-100) pays nothing; the pages read turned (upside down, or on their
# side counter-clockwise) came out at 0-15.
ORIENTATION_CHECK_BELOW = 60.0
# A page whose lines slope this much or more (degrees, from tesseract's baselines) is read again
# levelled: one more reading for a skewed page; a level page pays nothing.
DESKEW_FROM_DEGREES = 1.5


def group_words(
    data: Mapping[str, Sequence[Any]],
    baselines: Mapping[tuple, list[int]] | None = None,
) -> tuple[str, list[dict[str, Any]], float]:
    """Turn tesseract's word table into (page text, lines, page confidence): each line's
    confidence is its words' mean, the page's the share of its words read at
    ``SURE_WORD_CONFIDENCE`` or above (0-100). ``baselines``: each line's baseline by its box,
    as the TSV's line rows give it (``_baselines``), added to the lines found there."""
    grouped: dict[tuple[int, int, int], list[int]] = {}
    line_boxes: dict[tuple[int, int, int], tuple] = {}
    confidences: list[float] = []
    for i, word in enumerate(data.get("text", ())):
        conf = float(data["conf"][i])
        if baselines and data.get("level") and int(data["level"][i]) == 4:  # a line's row
            left, top = int(data["left"][i]), int(data["top"][i])
            key = (int(data["block_num"][i]), int(data["par_num"][i]), int(data["line_num"][i]))
            line_boxes[key] = (left, top, left + int(data["width"][i]), top + int(data["height"][i]))
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
        line = {"text": line_text, "bbox": [x0, y0, x1, y1], "confidence": round(line_conf, 2)}
        baseline = baselines.get(line_boxes.get((block, par, _line))) if baselines else None
        if baseline:
            line["baseline"] = list(baseline)
        lines.append(line)
        if previous_par is not None and previous_par != (block, par):
            parts.append("")  # blank line marks a paragraph or block break
        parts.append(line_text)
        previous_par = (block, par)

    sure = sum(1 for conf in confidences if conf >= SURE_WORD_CONFIDENCE)
    page = round(100.0 * sure / len(confidences), 2) if confidences else 0.0
    return "\n".join(parts), lines, page
