"""Pages read whichever way up they come (issue 40): orientation detected and turned upright
before reading, the rotation and skew found recorded, every line's box and baseline on the page
as it was given."""

from __future__ import annotations

import pytest
from PIL import Image, ImageDraw, ImageFont

from podserver import orientation

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


def test_an_upright_page_read_well_is_not_checked_for_orientation(engines, monkeypatch) -> None:
    engine = engines["api"]
    asked = []
    monkeypatch.setattr(engine, "_detect_orientation", lambda *args: asked.append(args) or 0)

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
