"""Tesseract wrapping: image decoding, the OCR call and shaping its output."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

import pytesseract
from PIL import Image

from .pages import MAX_PIXELS, BadImage, decode_image

ENGINE = "tesseract"

__all__ = ["MAX_PIXELS", "BadImage", "PageTimeout", "decode_image", "group_words", "load", "ocr_image"]


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
