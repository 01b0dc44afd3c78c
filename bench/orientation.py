"""Pages as they come (issue 40): the same pages read upright, turned four ways and skewed, by the
pod's tesseract engine in this process, with its orientation and skew detection.

    OMP_THREAD_LIMIT=1 .venv/bin/python bench/orientation.py [--pages 6] [--skews=-5,-3,-2,2,3,5]

Each page (``--pages`` of them, DejaVu text at about 200 DPI, made from a seed) is read upright,
then turned 90°, 180° and 270° (PIL, counter-clockwise), then skewed by each of ``--skews``
degrees with its lines single-spaced and long (where tesseract alone mixes or loses lines). For
each it prints the word accuracy (the share of the page's words read, in order) against the
upright reading's, the rotation and skew the engine recorded, and the CPU seconds the reading
took: an upright page read well pays nothing for the detection; a turned one pays OSD (~0.2 s)
and a second reading, a skewed one a second reading.

Ends with one JSON line whose "goal" names each goal, counted (tests/bench/test_orientation.py
asserts them at a small size): every_turn_within_5_pct (each turned page's accuracy >= 0.95 x its
upright reading's), every_skew_within_5_pct (the same for the skewed pages against their own
level reading), rotation_recorded and skew_recorded (within 0.5°), no_warning (a page read well
carries none).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from podserver.engines import create  # noqa: E402
from tests.podserver.helpers import letter_page, page_lines, word_accuracy  # noqa: E402

# PIL turns counter-clockwise: text turned 90° counter-clockwise is at rotation 270 (clockwise).
TURNS = {0: 0, 90: 270, 180: 180, 270: 90}


def read(engine, img, lines: list[str]) -> dict:
    started = time.process_time()
    result = engine.ocr(img, "eng", 120)
    return {
        "accuracy": round(word_accuracy(result["text"], lines), 4),
        "rotation": result["rotation"],
        "skew": result["skew"],
        "confidence": result["confidence"],
        "warnings": result["warnings"],
        "cpu_s": round(time.process_time() - started, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pages", type=int, default=6)
    parser.add_argument("--skews", default="-5,-3,-2,2,3,5", help="degrees, comma-separated")
    args = parser.parse_args()
    os.environ.setdefault("OMP_THREAD_LIMIT", "1")
    skews = [float(value) for value in args.skews.split(",") if value.strip()]
    engine = create("tesseract", environ={})
    engine.load()
    turns, skewed = [], []
    for seed in range(args.pages):
        lines = page_lines(12, seed=seed)
        page = letter_page(lines)
        upright = read(engine, page, lines)
        for degrees, rotation in TURNS.items():
            got = upright if not degrees else read(engine, page.rotate(degrees, expand=True), lines)
            turns.append({"page": seed, "turned": degrees, "expected_rotation": rotation, "upright": upright["accuracy"],
                          **got})  # fmt: skip
        long_lines = page_lines(10, seed=seed, words=14)
        dense = letter_page(long_lines, leading=40)
        level = read(engine, dense, long_lines)
        for skew in skews:
            got = read(engine, dense.rotate(skew, expand=True, fillcolor=255), long_lines)
            skewed.append({"page": seed, "skew_made": skew, "level": level["accuracy"], **got})
    for row in turns + skewed:
        print(json.dumps(row), file=sys.stderr)
    upright_cpu = [row["cpu_s"] for row in turns if row["turned"] == 0]
    turned_cpu = [row["cpu_s"] for row in turns if row["turned"]]
    goal = {
        "every_turn_within_5_pct": all(row["accuracy"] >= 0.95 * row["upright"] for row in turns),
        "every_skew_within_5_pct": all(row["accuracy"] >= 0.95 * row["level"] for row in skewed),
        "rotation_recorded": all(row["rotation"] == row["expected_rotation"] for row in turns),
        "skew_recorded": all(abs(row["skew"] - row["skew_made"]) <= 0.5 for row in skewed),
        "no_warning": not any(row["warnings"] for row in turns + skewed),
    }
    figures = {
        "benchmark": "orientation",
        "pages": args.pages,
        "skews": skews,
        "accuracy_by_turn": {
            str(degrees): round(statistics.mean(row["accuracy"] for row in turns if row["turned"] == degrees), 4)
            for degrees in TURNS
        },
        "accuracy_by_skew": {
            str(skew): round(statistics.mean(row["accuracy"] for row in skewed if row["skew_made"] == skew), 4)
            for skew in skews
        },
        "cpu_s_upright_page": round(statistics.mean(upright_cpu), 3),
        "cpu_s_turned_page": round(statistics.mean(turned_cpu), 3),
        "cpu_s_skewed_page": round(statistics.mean(row["cpu_s"] for row in skewed), 3) if skewed else None,
        "goal": goal,
        "goal_met": all(goal.values()),
    }
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
