"""A page's orientation and skew: turning a page upright to read it, and its lines back onto the
page as it is shown.

An engine that reads a page turned upright (tesseract after its orientation detection) reports
each line's box and baseline in the turned page's pixels; the viewer draws them on the page as
the document shows it, and the searchable PDF writes them there. ``lines_back`` maps them onto
the page as given, so the page's ``width``, ``height`` and every ``bbox`` stay in the pixels of
the page the pod was sent or rendered.

Angles are in degrees, counter-clockwise as a reader sees them (the y axis of pixels points
down). A page's ``rotation`` is how far its text is turned clockwise from upright: 0, 90, 180 or
270 (the reading turned it back); its ``skew`` is how far its lines then slope, counter-clockwise,
within ±45.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

from PIL import Image

TURNS = (0, 90, 180, 270)


def turn(img: Image.Image, degrees: int) -> Image.Image:
    """The page turned ``degrees`` (a multiple of 90) counter-clockwise, with nothing cropped."""
    transpose = {90: Image.Transpose.ROTATE_90, 180: Image.Transpose.ROTATE_180, 270: Image.Transpose.ROTATE_270}
    return img.transpose(transpose[degrees % 360]) if degrees % 360 else img


def point_back(x: float, y: float, degrees: int, width: int, height: int) -> tuple[float, float]:
    """Where a point of the page turned ``degrees`` counter-clockwise lies on the page as given
    (``width`` × ``height``, before the turn)."""
    degrees %= 360
    if degrees == 90:
        return width - y, x
    if degrees == 180:
        return width - x, height - y
    if degrees == 270:
        return y, height - x
    return x, y


def lines_back(lines: list[dict[str, Any]], degrees: int, width: int, height: int) -> list[dict[str, Any]]:
    """Lines read on the page turned ``degrees`` counter-clockwise, with their boxes and baselines
    on the page as given (``width`` × ``height``)."""
    if not degrees % 360:
        return lines
    moved = []
    for line in lines:
        line = dict(line)
        x0, y0, x1, y1 = line["bbox"]
        (ax, ay), (bx, by) = (point_back(x0, y0, degrees, width, height), point_back(x1, y1, degrees, width, height))
        line["bbox"] = [round(min(ax, bx)), round(min(ay, by)), round(max(ax, bx)), round(max(ay, by))]
        if line.get("baseline"):
            x0, y0, x1, y1 = line["baseline"]
            start, end = point_back(x0, y0, degrees, width, height), point_back(x1, y1, degrees, width, height)
            line["baseline"] = [round(v) for v in (*start, *end)]
        moved.append(line)
    return moved


def straighten(img: Image.Image, degrees: float) -> Image.Image:
    """The page turned ``degrees`` counter-clockwise (a skew's correction), on white, uncropped."""
    fill = 255 if img.mode == "L" else (255, 255, 255)
    return img.rotate(degrees, resample=Image.Resampling.BILINEAR, expand=True, fillcolor=fill)


def lines_unskewed(
    lines: list[dict[str, Any]], degrees: float, straight: tuple[int, int], size: tuple[int, int]
) -> list[dict[str, Any]]:
    """Lines read on the page ``straighten``ed by ``degrees`` (``straight``: its size) with their
    boxes (the boxes of their turned corners) and baselines on the page as given (``size``)."""
    cos, sin = math.cos(math.radians(degrees)), math.sin(math.radians(degrees))
    (sw, sh), (w, h) = straight, size

    def back(x: float, y: float) -> tuple[float, float]:
        dx, dy = x - sw / 2, y - sh / 2
        return w / 2 + dx * cos - dy * sin, h / 2 + dx * sin + dy * cos

    moved = []
    for line in lines:
        line = dict(line)
        x0, y0, x1, y1 = line["bbox"]
        corners = [back(x, y) for x in (x0, x1) for y in (y0, y1)]
        xs, ys = [x for x, _ in corners], [y for _, y in corners]
        line["bbox"] = [max(0, round(min(xs))), max(0, round(min(ys))), min(w, round(max(xs))), min(h, round(max(ys)))]
        if line.get("baseline"):
            bx0, by0, bx1, by1 = line["baseline"]
            line["baseline"] = [round(v) for v in (*back(bx0, by0), *back(bx1, by1))]
        moved.append(line)
    return moved


# Skews a page is searched for, in degrees each way: scanners and phones skew pages by a few.
SKEW_SEARCH = 6.0


def skew_correction(img: Image.Image) -> float:
    """The counter-clockwise turn (degrees, within ±SKEW_SEARCH) that makes the page's lines
    level: the angle at which its rows of ink are sharpest (the projection profile's squared
    differences between neighbouring rows), found on a copy about 600 pixels wide; 0 for a page
    with no lines to level. ~0.1 s of CPU for a letter page at 200 DPI."""
    gray = img.convert("L")
    factor = min(1.0, 600 / max(1, gray.width))
    small = gray.resize((max(1, round(gray.width * factor)), max(1, round(gray.height * factor))))
    ink = small.point(lambda v: 255 if v < 128 else 0)

    def sharpness(angle: float) -> float:
        turned = ink.rotate(angle, resample=Image.Resampling.NEAREST, expand=True, fillcolor=0)
        rows = turned.resize((1, turned.height), Image.Resampling.BOX).tobytes()
        return float(sum((a - b) ** 2 for a, b in zip(rows, rows[1:], strict=False)))

    level = sharpness(0.0)
    if level == 0:
        return 0.0
    best = max((sharpness(a / 2), a / 2) for a in range(-int(2 * SKEW_SEARCH), int(2 * SKEW_SEARCH) + 1))
    fine = max((sharpness(best[1] + a / 10), best[1] + a / 10) for a in range(-4, 5))
    return round(fine[1], 1) if fine[0] > level else 0.0


def baseline_angle(baseline: list[float]) -> float:
    """The angle of a baseline [x0, y0, x1, y1] (from its start to its end), in (-180, 180]."""
    x0, y0, x1, y1 = baseline
    return _normal(math.degrees(math.atan2(y0 - y1, x1 - x0)))


def _normal(angle: float) -> float:
    """The same angle in (-180, 180]."""
    angle = math.fmod(angle, 360.0)
    if angle <= -180:
        angle += 360
    elif angle > 180:
        angle -= 360
    return angle


def with_angles(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each line that has a baseline given its ``angle`` (rounded to a tenth of a degree)."""
    for line in lines:
        if line.get("baseline"):
            line["angle"] = round(baseline_angle(line["baseline"]), 1)
    return lines


def page_orientation(lines: list[dict[str, Any]], fallback: int = 0) -> tuple[int, float]:
    """(rotation, skew) of a page from its lines' angles: the rotation most of its text (by
    characters) is at, and the median slope of the lines at that rotation. ``fallback`` is the
    rotation of a page none of whose lines has an angle."""
    weights: Counter[int] = Counter()
    slopes: dict[int, list[float]] = {}
    for line in lines:
        angle = line.get("angle")
        if angle is None:
            continue
        rotation = round(-angle / 90) * 90 % 360  # text at -90° runs down the page: turned 90° clockwise
        weights[rotation] += max(1, len(line.get("text", "")))
        slopes.setdefault(rotation, []).append(_normal(angle + rotation))
    if not weights:
        return fallback % 360, 0.0
    rotation = weights.most_common(1)[0][0]
    found = sorted(slopes[rotation])
    middle = len(found) // 2
    skew = found[middle] if len(found) % 2 else (found[middle - 1] + found[middle]) / 2
    return rotation, round(skew, 2)
