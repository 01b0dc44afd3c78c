"""Tesseract wrapping: image decoding, the OCR call and shaping its output."""

from __future__ import annotations

import io
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

import pytesseract
from PIL import Image, ImageOps

ENGINE = "tesseract"
MAX_PIXELS = 100_000_000

# decode_image checks the size itself (Pillow only warns between its MAX_IMAGE_PIXELS
# and twice that). Pillow's global is set by the pod process (__main__), not on
# import: a process that imports this module for other reasons keeps its own.

_MODES_16BIT = {"I", "I;16", "I;16B", "I;16L", "I;16N", "F"}


class BadImage(ValueError):
    """The request body is not an image we are willing to OCR."""


class PageTimeout(Exception):
    """Tesseract ran past the page time limit and was killed."""


def load() -> tuple[str, list[str]]:
    """Check the tesseract binary answers; return (version, installed languages)."""
    # Tesseract's OpenMP threads fight each other when several lanes run at once:
    # one thread per process is ~6x faster per page here. pytesseract passes
    # os.environ to every child, so setting it before the first call is enough.
    os.environ["OMP_THREAD_LIMIT"] = "1"
    try:
        version = str(pytesseract.get_tesseract_version())
    except SystemExit as exc:  # pytesseract exits on an unparsable version string
        raise RuntimeError(str(exc)) from None
    languages = sorted(pytesseract.get_languages())
    if not languages:
        raise RuntimeError("tesseract reports no installed languages")
    return version, languages


def decode_image(data: bytes) -> Image.Image:
    """Decode one page image into a mode tesseract handles well (L or RGB)."""
    try:
        with Image.open(io.BytesIO(data)) as probe:
            _check_size(probe)
            probe.verify()
        # verify() leaves the image unusable, so decode again for real.
        img = Image.open(io.BytesIO(data))
        img.load()
        img = ImageOps.exif_transpose(img)  # phone photos arrive rotated otherwise
    except BadImage:
        raise
    except Image.DecompressionBombError as exc:
        raise BadImage(f"image too large: {exc}") from None
    # Corrupt data surfaces as OSError, ValueError, SyntaxError, struct.error, ...
    # depending on the plugin, so anything Pillow raises here means "not an image".
    except Exception as exc:
        raise BadImage(f"not an image: {exc}") from None
    return _normalise(img)


def _check_size(img: Image.Image) -> None:
    width, height = img.size
    if width * height > MAX_PIXELS:
        limit = MAX_PIXELS // 1_000_000
        raise BadImage(f"image too large: {width}x{height} exceeds {limit} megapixels")


def _normalise(img: Image.Image) -> Image.Image:
    # Always return a fresh image whose .format is None: pytesseract re-saves the
    # image in its original format, and a JPEG would be recompressed lossily.
    if "A" in img.getbands() or (img.mode == "P" and "transparency" in img.info):
        rgba = img.convert("RGBA")
        # Transparent means paper: flattening onto black would hide black ink.
        page = Image.new("RGB", img.size, "white")
        page.paste(rgba, mask=rgba.getchannel("A"))
        return page
    if img.mode in _MODES_16BIT:
        # convert("L") clips 16-bit values (most scans turn white); stretch instead.
        wide = img if img.mode == "F" else img.convert("I")
        lo, hi = wide.getextrema()
        scale = 255.0 / (hi - lo) if hi > lo else 1.0
        return wide.point(lambda v: (v - lo) * scale).convert("L")
    if img.mode in ("L", "1"):
        return img.convert("L")
    return img.convert("RGB")


def ocr_image(img: Image.Image, lang: str, timeout: float) -> dict[str, Any]:
    """OCR one page; PageTimeout past the limit, other exceptions are engine errors."""
    started = time.monotonic()
    try:
        data = pytesseract.image_to_data(img, lang=lang, output_type=pytesseract.Output.DICT, timeout=timeout)
    except RuntimeError as exc:
        # pytesseract signals its own kill only through this message.
        if "timeout" in str(exc).lower():
            raise PageTimeout(str(exc)) from None
        raise
    text, lines, confidence = group_words(data)
    return {
        "text": text,
        "lines": lines,
        "confidence": confidence,
        "width": img.width,
        "height": img.height,
        "engine": ENGINE,
        "seconds": round(time.monotonic() - started, 3),
    }


def group_words(
    data: Mapping[str, Sequence[Any]],
) -> tuple[str, list[dict[str, Any]], float]:
    """Turn tesseract's word table into (page text, lines, mean word confidence)."""
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

    mean = round(sum(confidences) / len(confidences), 2) if confidences else 0.0
    return "\n".join(parts), lines, mean
