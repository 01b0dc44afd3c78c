"""The confidence cascade (issue 26): tesseract first, rapidocr for the pages it is unsure of.

    .venv/bin/python bench/cascade.py [--pages 60] [--calibration 40] [--seed 26] [--threshold T]

Pages of known text (lines of words drawn with DejaVu Sans), each degraded deterministically from
the seed: clean, noise (Gaussian plus salt and pepper), blur, low resolution (scanned small,
scaled back up) or rotation, each at a severity drawn from the seed. Both engines read every page
in this process (podserver/engines, as a pod calls them: one lane, ``OMP_THREAD_LIMIT=1``,
``RAPIDOCR_THREADS=1``); each reading's character accuracy (1 - edit distance / length of the
truth, whitespace folded, as bench/local.py counts it) and CPU-seconds (this process and its reaped children, from getrusage,
one page at a time) are kept. The cascade is what the fleet does with those readings: tesseract's
reading when its page confidence is at or above the threshold, else rapidocr's, at tesseract's
cost plus rapidocr's for the escalated pages (the engines are deterministic: reading a page again
in the cascade gives the reading it gave here).

The threshold is chosen on ``--calibration`` pages of their own (another seed), never on the pages
it is judged on: the cheapest whose cascade is at least as accurate as the better engine alone
there (``--threshold`` sets it instead). Tesseract's page confidence is the share of its words
read at 90 or above (podserver/engines/tesseract.py); how well each engine's confidence orders the
pages by their accuracy is printed (Spearman's rank correlation). The figures are the evaluation
pages': accuracy and CPU-seconds per page of tesseract alone, rapidocr alone and the cascade, the
share escalated, and the same per kind of degradation.

Ends with one JSON line whose "goal" names each goal. Counted (tests/bench/test_cascade.py asserts
them at a small size): every_page_read (both engines answered every page), every_kind_degraded
(each kind of degradation is among the pages), as_accurate_as_the_better_engine (the cascade's
accuracy >= the better engine's alone), escalated_some_not_all (the threshold sends some pages
on and keeps some). Measured, for a reader: at_most_half_the_cost (the cascade's CPU-seconds per
page <= half of the better engine's). No control plane runs here (no front, no workers:
bench/_cpu.py), so there is no control-plane CPU a page: the engines' CPU is the figure.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import resource
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ["OMP_THREAD_LIMIT"] = "1"  # one thread a lane, as a pod runs tesseract
os.environ.setdefault("RAPIDOCR_THREADS", "1")

import numpy as np  # noqa: E402
from PIL import Image, ImageDraw, ImageFilter, ImageFont  # noqa: E402

from bench.local import char_accuracy  # noqa: E402
from podserver import engines  # noqa: E402

FONT = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf"
WORDS = (
    "the river authority report water levels rose by centimetres in march northern gauge replaced "
    "maintenance pumps serviced valve renewed costs stayed within budget euros inspection planned "
    "invoice number total amount due customer account balance payment received thank you for your "
    "order delivery address shipping date quantity price description weight"
).split()
KINDS = ("clean", "noise", "blur", "lowres", "rotation")
ENGINES = ("tesseract", "rapidocr")
COST_GOAL = 0.5  # the cascade's CPU-seconds per page against the better engine's alone


@dataclass(frozen=True)
class Page:
    kind: str
    severity: float  # 0..1
    truth: str
    image: Image.Image


@dataclass(frozen=True)
class Reading:
    accuracy: float
    cpu: float
    confidence: float


def make_page(rng: random.Random, kind: str) -> Page:
    font = ImageFont.truetype(FONT, 26) if os.path.exists(FONT) else ImageFont.load_default(size=26)
    img = Image.new("L", (1100, 520), 255)
    draw = ImageDraw.Draw(img)
    lines = []
    for row in range(8):
        words = [rng.choice(WORDS) for _ in range(rng.randint(5, 8))]
        if rng.random() < 0.5:
            words.append(str(rng.randint(10, 99999)))
        line = " ".join(words)
        lines.append(line)
        draw.text((40, 30 + row * 58), line, font=font, fill=0)
    severity = rng.random()
    return Page(kind, severity, "\n".join(lines), degrade(img, kind, severity, rng))


def degrade(img: Image.Image, kind: str, severity: float, rng: random.Random) -> Image.Image:
    if kind == "noise":
        pixels = np.asarray(img, dtype=np.float32)
        noise = np.random.default_rng(rng.randrange(2**32))
        pixels = pixels + noise.normal(0, 15 + 55 * severity, pixels.shape)
        speckle = noise.random(pixels.shape)
        share = 0.005 + 0.03 * severity
        pixels[speckle < share / 2] = 0
        pixels[speckle > 1 - share / 2] = 255
        img = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))
    elif kind == "blur":
        img = img.filter(ImageFilter.GaussianBlur(0.8 + 2.0 * severity))
    elif kind == "lowres":
        scale = 0.5 - 0.22 * severity  # as if scanned at ~100 down to ~55 DPI
        small = img.resize((int(img.width * scale), int(img.height * scale)), Image.Resampling.BILINEAR)
        img = small.resize(img.size, Image.Resampling.BILINEAR)
    elif kind == "rotation":
        angle = rng.choice((-1, 1)) * (0.5 + 3.5 * severity)  # a page fed askew: up to 4 degrees
        img = img.rotate(angle, resample=Image.Resampling.BILINEAR, expand=True, fillcolor=255)
    return img.convert("RGB")


def pages(count: int, seed: int) -> list[Page]:
    rng = random.Random(seed)
    return [make_page(rng, KINDS[n % len(KINDS)]) for n in range(count)]


def fold(text: str) -> str:
    return " ".join(text.split())


def accuracy(got: str, truth: str) -> float:
    return char_accuracy(fold(got), fold(truth))


def own_cpu() -> float:
    """CPU-seconds of this process and its reaped children (tesseract's command, if it runs one)."""
    me, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + children.ru_utime + children.ru_stime


def read_all(engine, batch: list[Page]) -> list[Reading]:
    readings = []
    for page in batch:
        started = own_cpu()
        result = engine.ocr(page.image, "eng", 120)
        cpu = own_cpu() - started
        confidence = float(result.get("confidence") or 0.0)
        readings.append(Reading(accuracy(result.get("text") or "", page.truth), cpu, confidence))
    return readings


def cascade(first: list[Reading], second: list[Reading], threshold: float) -> tuple[float, float, int]:
    """(mean accuracy, mean CPU-seconds, pages escalated) of the cascade at ``threshold``."""
    accuracy = cpu = 0.0
    escalated = 0
    for one, two in zip(first, second, strict=True):
        if one.confidence >= threshold:
            accuracy += one.accuracy
            cpu += one.cpu
        else:
            accuracy += two.accuracy
            cpu += one.cpu + two.cpu
            escalated += 1
    return accuracy / len(first), cpu / len(first), escalated


def mean(values) -> float:
    values = list(values)
    return sum(values) / len(values) if values else 0.0


def choose_threshold(first: list[Reading], second: list[Reading]) -> float:
    """The cheapest threshold at least as accurate as the better engine alone (ties: the more
    accurate); without one, the most accurate. (The most accurate within the cost goal instead
    overfitted the calibration pages: 43 % of the evaluation pages escalated, 0.58 of the cost,
    less accurate.)"""
    better = max(mean(r.accuracy for r in readings) for readings in (first, second))
    candidates = sorted({0.0, 101.0, *(r.confidence + 0.01 for r in first)})
    scored = [(threshold, *cascade(first, second, threshold)) for threshold in candidates]
    enough = [s for s in scored if s[1] >= better]
    if not enough:
        return max(scored, key=lambda s: (s[1], -s[2]))[0]
    return min(enough, key=lambda s: (s[2], -s[1]))[0]


def rank_correlation(xs: list[float], ys: list[float]) -> float | None:
    """Spearman's: how well the confidence orders the pages by their accuracy (ties: mean ranks)."""

    def ranks(values: list[float]) -> list[float]:
        order = sorted(range(len(values)), key=values.__getitem__)
        out = [0.0] * len(values)
        start = 0
        while start < len(order):
            end = start
            while end + 1 < len(order) and values[order[end + 1]] == values[order[start]]:
                end += 1
            for k in range(start, end + 1):
                out[order[k]] = (start + end) / 2
            start = end + 1
        return out

    if len(xs) < 3:
        return None
    rx, ry = ranks(xs), ranks(ys)
    try:
        return statistics.correlation(rx, ry)
    except statistics.StatisticsError:  # every page alike
        return None


def figures_of(readings: list[Reading]) -> dict:
    return {
        "accuracy": round(mean(r.accuracy for r in readings), 4),
        "cpu_seconds_per_page": round(mean(r.cpu for r in readings), 4),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pages", type=int, default=60, help="evaluation pages")
    parser.add_argument("--calibration", type=int, default=40, help="pages the threshold is chosen on")
    parser.add_argument("--seed", type=int, default=26)
    parser.add_argument("--threshold", type=float, default=None, help="use this threshold (0-100), choose none")
    args = parser.parse_args()
    if args.pages < len(KINDS) or (args.threshold is None and args.calibration < 1):
        parser.error(f"--pages >= {len(KINDS)} (a page of each kind), and --calibration >= 1 without --threshold")
    started = time.perf_counter()
    evaluation = pages(args.pages, args.seed)
    calibration = [] if args.threshold is not None else pages(args.calibration, args.seed + 1_000_003)
    readings: dict[str, dict[str, list[Reading]]] = {"evaluation": {}, "calibration": {}}
    versions = {}
    for name in ENGINES:
        engine = engines.create(name, environ=os.environ)
        engine.load()
        versions[name] = engine.version
        engine.ocr(evaluation[0].image, "eng", 120)  # a first page warms the engine; not counted
        readings["evaluation"][name] = read_all(engine, evaluation)
        readings["calibration"][name] = read_all(engine, calibration)
    chosen_on = "given" if args.threshold is not None else f"{args.calibration} calibration pages"
    threshold = args.threshold
    if threshold is None:
        threshold = choose_threshold(readings["calibration"]["tesseract"], readings["calibration"]["rapidocr"])
    first, second = readings["evaluation"]["tesseract"], readings["evaluation"]["rapidocr"]
    cascade_accuracy, cpu, escalated = cascade(first, second, threshold)
    alone = {name: figures_of(readings["evaluation"][name]) for name in ENGINES}
    better = max(ENGINES, key=lambda name: alone[name]["accuracy"])
    by_kind = {}
    for kind in KINDS:
        ids = [n for n, page in enumerate(evaluation) if page.kind == kind]
        kind_first, kind_second = [first[n] for n in ids], [second[n] for n in ids]
        kind_accuracy, kind_cpu, kind_escalated = cascade(kind_first, kind_second, threshold)
        by_kind[kind] = {
            "pages": len(ids),
            "tesseract": figures_of(kind_first)["accuracy"],
            "rapidocr": figures_of(kind_second)["accuracy"],
            "cascade": round(kind_accuracy, 4),
            "escalated": kind_escalated,
        }
    goal = {
        "every_page_read": all(len(readings["evaluation"][name]) == len(evaluation) for name in ENGINES),
        "every_kind_degraded": {page.kind for page in evaluation} == set(KINDS),
        "as_accurate_as_the_better_engine": cascade_accuracy
        >= mean(r.accuracy for r in readings["evaluation"][better]) - 1e-9,
        "escalated_some_not_all": 0 < escalated < len(evaluation),
        "at_most_half_the_cost": cpu <= COST_GOAL * alone[better]["cpu_seconds_per_page"],
    }
    figures = {
        "benchmark": "cascade",
        "pages": len(evaluation),
        "seed": args.seed,
        "threshold": round(threshold, 2),
        "threshold_chosen_on": chosen_on,
        "engines": {name: {**alone[name], "version": versions[name]} for name in ENGINES},
        "better_engine": better,
        "cascade": {
            "accuracy": round(cascade_accuracy, 4),
            "cpu_seconds_per_page": round(cpu, 4),
            "escalated": escalated,
            "escalated_share": round(escalated / len(evaluation), 3),
            "cost_vs_better_engine": round(cpu / max(1e-9, alone[better]["cpu_seconds_per_page"]), 3),
        },
        "by_kind": by_kind,
        "confidence_accuracy_rank_correlation": {
            name: round(value, 3)
            if (
                value := rank_correlation(
                    [r.confidence for r in readings["evaluation"][name]],
                    [r.accuracy for r in readings["evaluation"][name]],
                )
            )
            is not None
            else None
            for name in ENGINES
        },
        "seconds": round(time.perf_counter() - started, 1),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "goal": goal,
        "goal_met": all(goal.values()),
    }
    print(
        f"threshold {figures['threshold']} ({chosen_on}); "
        + "; ".join(f"{n}: accuracy {alone[n]['accuracy']:.4f}, {alone[n]['cpu_seconds_per_page']:.3f} CPU-s/page"
                    for n in ENGINES)
        + f"; cascade: accuracy {cascade_accuracy:.4f}, {cpu:.3f} CPU-s/page, {escalated}/{len(evaluation)} escalated"
    )  # fmt: skip
    print("control-plane CPU: none in this run (the engines in this process, no front, no workers)")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
