"""Pages read whichever way up they come (issue 40): orientation detected and turned upright
before reading, the rotation and skew found recorded, every line's box and baseline on the page
as it was given."""

from __future__ import annotations

import hashlib
import io

import httpx
import pytest
from PIL import Image, ImageDraw, ImageFont

from podserver import orientation
from podserver.engines import PageTimeout

from .helpers import FONT, letter_page, page_lines, word_accuracy

pytestmark = pytest.mark.once_sqlite


def ink_under(img: Image.Image, bbox: list[int]) -> float:
    """The share of dark pixels inside a box of the page."""
    crop = img.crop(tuple(bbox)).convert("L")
    return sum(crop.histogram()[:128]) / max(1, crop.width * crop.height)


# PIL turns counter-clockwise: text turned 90° counter-clockwise is at rotation 270 (clockwise).
@pytest.mark.parametrize(("turned", "rotation"), [(0, 0), (90, 270), (180, 180), (270, 90)])
def test_a_page_turned_any_way_reads_as_well_as_upright_with_its_rotation(engines, turned, rotation) -> None:
    lines = page_lines()
    upright = engines["api"].ocr(letter_page(lines), "eng", 60)
    page = letter_page(lines).rotate(turned, expand=True)

    result = engines["api"].ocr(page, "eng", 60)

    assert word_accuracy(result["text"], lines) >= 0.95 * word_accuracy(upright["text"], lines)
    assert word_accuracy(result["text"], lines) > 0.9
    assert result["rotation"] == rotation and abs(result["skew"]) < 0.5
    assert (result["width"], result["height"]) == page.size
    assert not result["warnings"]
    # Every line's box is on the page as given, over its ink, and its baseline runs its way.
    for line in result["lines"]:
        assert ink_under(page, line["bbox"]) > 0.05, line
        assert orientation.page_orientation([line])[0] == rotation


def test_the_command_turns_an_upside_down_page_too(engines) -> None:
    lines = page_lines()
    page = letter_page(lines).rotate(180)

    result = engines["command"].ocr(page, "eng", 60)

    assert word_accuracy(result["text"], lines) > 0.9
    assert result["rotation"] == 180
    first = result["lines"][0]["bbox"]
    assert first[1] > page.height / 2  # the first line read is at the bottom of the page as given


@pytest.mark.parametrize("skew", [3.0, -2.0])
def test_a_skewed_page_reads_and_records_its_skew(engines, skew) -> None:
    lines = page_lines()
    page = letter_page(lines).rotate(skew, expand=True, fillcolor=255)

    result = engines["api"].ocr(page, "eng", 60)

    assert word_accuracy(result["text"], lines) > 0.9
    assert result["rotation"] == 0 and result["skew"] == pytest.approx(skew, abs=0.5)
    assert all(line["angle"] == pytest.approx(skew, abs=1.5) for line in result["lines"])


@pytest.mark.parametrize("skew", [-2.0, -3.0, 5.0])
def test_a_skewed_single_spaced_page_is_read_again_level(engines, skew) -> None:
    # Tesseract alone: at -2° half as many lines (two lines' words mixed, read at 97), at -3° nothing.
    lines = page_lines(10, seed=1, words=14)
    page = letter_page(lines, leading=40).rotate(skew, expand=True, fillcolor=255)

    result = engines["api"].ocr(page, "eng", 60)

    assert word_accuracy(result["text"], lines) > 0.95
    assert len(result["lines"]) == 10 and result["skew"] == pytest.approx(skew, abs=0.5)
    for line in result["lines"]:  # put back on the page as given, over their ink
        assert ink_under(page, line["bbox"]) > 0.05, line
        assert line["angle"] == pytest.approx(skew, abs=1.0)


def test_a_skew_found_from_the_ink_levels_the_page() -> None:
    page = letter_page(page_lines(10, seed=1, words=14), leading=40)
    assert orientation.skew_correction(page.rotate(-3, expand=True, fillcolor=255)) == pytest.approx(3, abs=0.3)
    assert orientation.skew_correction(page) == 0
    assert orientation.skew_correction(Image.new("L", (300, 200), 255)) == 0


def test_an_upright_page_read_well_is_not_checked_for_orientation(engines, monkeypatch) -> None:
    engine = engines["api"]
    asked = []
    monkeypatch.setattr(engine, "_detect_orientation", lambda *args: asked.append(args) or 0)
    monkeypatch.setattr(orientation, "skew_correction", lambda *args: asked.append(args) or 0)
    monkeypatch.setattr(orientation, "straighten", lambda *args: asked.append(args))

    result = engine.ocr(letter_page(page_lines()), "eng", 60)

    assert result["confidence"] >= 90 and asked == []


def test_a_page_too_sparse_to_tell_its_orientation_is_a_warning(engines) -> None:
    img = Image.new("L", (900, 400), 255)
    ImageDraw.Draw(img).text((60, 150), "x7 ~q", font=ImageFont.truetype(FONT, 40), fill=0)

    result = engines["api"].ocr(img.rotate(180), "eng", 60)

    assert result["confidence"] < 60
    assert result["warnings"] == ["orientation unknown: too little text to tell which way up the page is"]


def test_a_blank_page_has_no_warning(engines) -> None:
    result = engines["api"].ocr(Image.new("L", (900, 400), 255), "eng", 60)
    assert result["text"] == "" and result["warnings"] == []


@pytest.mark.parametrize("turned", [90, 180, 270])
def test_a_point_of_a_turned_page_maps_back_onto_the_page_as_given(turned) -> None:
    page = Image.new("L", (40, 30), 255)
    page.putpixel((7, 5), 0)
    upright = orientation.turn(page, turned)
    x, y = next((x, y) for x in range(upright.width) for y in range(upright.height) if upright.getpixel((x, y)) == 0)

    # A pixel's centre maps to the pixel's centre.
    back = orientation.point_back(x + 0.5, y + 0.5, turned, page.width, page.height)

    assert back == (7.5, 5.5)


def test_page_orientation_follows_most_of_the_text() -> None:
    lines = [
        {"text": "a long line of body text", "angle": -89.0},
        {"text": "another long line of text", "angle": -91.5},
        {"text": "stamp", "angle": 0.0},
    ]
    assert orientation.page_orientation(lines) == (90, -0.25)
    assert orientation.page_orientation([{"text": "x", "angle": 179.0}, {"text": "y", "angle": -178.0}]) == (180, 0.5)
    assert orientation.page_orientation([], fallback=180) == (180, 0.0)
    assert orientation.baseline_angle([0, 10, 10, 0]) == pytest.approx(45.0)


@pytest.mark.parametrize("degrees", [3.0, -4.5])
def test_a_box_of_a_straightened_page_maps_back_around_the_same_ink(degrees) -> None:
    page = Image.new("L", (400, 300), 255)
    page.paste(0, (100, 80, 104, 84))
    straight = orientation.straighten(page, degrees)
    dark = [(x, y) for y in range(straight.height) for x in range(straight.width) if straight.getpixel((x, y)) < 100]
    xs, ys = [x for x, _ in dark], [y for _, y in dark]
    line = {"text": "dot", "bbox": [min(xs), min(ys), max(xs) + 1, max(ys) + 1]}

    (back,) = orientation.lines_unskewed([line], degrees, straight.size, page.size)

    x0, y0, x1, y1 = back["bbox"]
    assert x0 <= 101 and y0 <= 81 and x1 >= 103 and y1 >= 83  # around the ink where it was
    assert x1 - x0 <= 8 and y1 - y0 <= 8


def test_the_pod_reads_a_pdf_of_one_page_turned_four_ways_alike(start_server) -> None:
    lines = page_lines(12, seed=5)
    upright = letter_page(lines)
    turned = [upright.rotate(degrees, expand=True) for degrees in (0, 90, 180, 270)]
    buffer = io.BytesIO()
    turned[0].save(buffer, format="PDF", save_all=True, append_images=turned[1:], resolution=200)
    data = buffer.getvalue()
    _, url = start_server()
    sha = hashlib.sha256(data).hexdigest()
    assert httpx.put(f"{url}/v1/documents/{sha}", content=data, timeout=60).status_code == 201

    read = [httpx.post(f"{url}/v1/ocr", json={"document": sha, "page": n, "dpi": 200}, timeout=60).json()
            for n in (1, 2, 3, 4)]  # fmt: skip

    accuracies = [word_accuracy(page["text"], lines) for page in read]
    assert all(accuracy >= 0.95 * accuracies[0] for accuracy in accuracies), accuracies
    assert [page["rotation"] for page in read] == [0, 270, 180, 90]
    assert all(page["warnings"] == [] for page in read)


def test_a_second_reading_past_the_time_limit_keeps_the_first(engines, monkeypatch) -> None:
    engine = engines["api"]
    page = letter_page(page_lines()).rotate(180)
    first = engine._read(page, "eng", 60)
    calls = []

    def read(img, lang, timeout):
        calls.append(img.size)
        if len(calls) > 1:
            raise PageTimeout("tesseract ran past the page time limit")
        return first

    monkeypatch.setattr(engine, "_read", read)

    result = engine.ocr(page, "eng", 60)

    assert len(calls) >= 2 and result["text"] == first[0]  # read twice; the first reading kept
