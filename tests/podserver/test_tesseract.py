"""Tesseract's word grouping, its two ways of reading a page (the C API and the command), and the
image normalisation, on their own."""

from __future__ import annotations

import pytest
from PIL import Image

from podserver.engines import PageTimeout
from podserver.engines.tesseract import group_words, parse_tsv
from podserver.pages import BadImage, decode_image
from tests.factories import accuracy

from .helpers import PAGE_LINES, encode, render

# The pod server touches no database: once, on the SQLite run.
pytestmark = pytest.mark.once_sqlite


def table(
    *rows: tuple[int, int, int, int, int, int, int, float, str],
) -> dict[str, list]:
    keys = (
        "block_num",
        "par_num",
        "line_num",
        "left",
        "top",
        "width",
        "height",
        "conf",
        "text",
    )
    return {key: [row[i] for row in rows] for i, key in enumerate(keys)}


def test_group_words_builds_lines_and_paragraph_breaks() -> None:
    data = table(
        (1, 0, 0, 0, 0, 500, 400, -1, ""),  # block container row
        (1, 1, 1, 10, 20, 40, 10, 90, "Hello"),
        (1, 1, 1, 60, 18, 50, 14, 80, "world"),
        (1, 1, 1, 120, 20, 5, 5, 95, " "),  # blank word is dropped
        (1, 1, 2, 10, 40, 30, 10, 70, "again"),
        (1, 2, 1, 10, 80, 30, 10, 60, "para"),
        (2, 1, 1, 10, 200, 30, 10, 100, "block"),
    )

    text, lines, confidence = group_words(data)

    assert text == "Hello world\nagain\n\npara\n\nblock"
    assert lines[0] == {
        "text": "Hello world",
        "bbox": [10, 18, 110, 32],
        "confidence": 85.0,
    }
    assert [line["text"] for line in lines] == ["Hello world", "again", "para", "block"]
    assert confidence == pytest.approx(100 * 2 / 5)  # the share of words read at 90 or above: 90 and 100


def test_group_words_without_words() -> None:
    assert group_words({}) == ("", [], 0.0)
    assert group_words(table((1, 0, 0, 0, 0, 9, 9, -1, ""))) == ("", [], 0.0)


def test_parse_tsv_gives_the_commands_word_table() -> None:
    # GetTSVText's rows: level page block par line word left top width height conf text.
    tsv = "1\t1\t0\t0\t0\t0\t0\t0\t500\t400\t-1\t\n5\t1\t1\t1\t1\t1\t10\t20\t40\t10\t91.5\tHello\n"

    data = parse_tsv(tsv)

    assert data["block_num"] == [0, 1] and data["word_num"] == [0, 1]
    assert data["conf"] == [-1.0, 91.5] and data["text"] == ["", "Hello"]
    assert group_words(data)[0] == "Hello"


def test_the_engine_reads_through_the_api_when_tesserocr_is_installed(engines) -> None:
    import tesserocr

    assert engines["api"].api is not None and engines["command"].api is None
    assert engines["api"].version == tesserocr.tesseract_version().split()[1]


def test_the_api_and_the_command_read_a_page_alike(engines) -> None:
    page = render(PAGE_LINES)
    texts = {way: engine.ocr(page, "eng", 60)["text"] for way, engine in engines.items()}
    assert accuracy(texts["api"], "\n".join(PAGE_LINES)) > 0.95
    assert accuracy(texts["api"], texts["command"]) > 0.99
    again = engines["api"].ocr(render(["a second page on a tesseract kept loaded"]), "eng", 60)
    assert accuracy(again["text"], "a second page on a tesseract kept loaded") > 0.9


@pytest.mark.parametrize("way", ["api", "command"])
def test_a_page_past_its_time_limit_is_a_page_timeout_either_way(engines, way: str) -> None:
    page = render(PAGE_LINES * 8)
    with pytest.raises(PageTimeout):
        engines[way].ocr(page, "eng", 0.001)
    assert engines[way].ocr(render(PAGE_LINES), "eng", 60)["text"]  # the engine reads on


@pytest.mark.parametrize(
    ("mode", "fmt", "expected"),
    [
        ("RGB", "JPEG", "RGB"),
        ("CMYK", "JPEG", "RGB"),
        ("P", "PNG", "RGB"),
        ("RGBA", "PNG", "RGB"),
        ("LA", "PNG", "RGB"),
        ("1", "PNG", "L"),
        ("L", "PNG", "L"),
        ("I;16", "TIFF", "L"),
        ("I;16", "PNG", "L"),
        ("F", "TIFF", "L"),
    ],
)
def test_decode_normalises_mode_and_drops_format(mode: str, fmt: str, expected: str) -> None:
    img = Image.new(mode, (20, 10))
    decoded = decode_image(encode(img, fmt))
    assert decoded.mode == expected
    assert decoded.size == (20, 10)
    # pytesseract re-saves in .format; None means lossless PNG, not a JPEG re-encode.
    assert decoded.format is None


def test_decode_stretches_16bit_contrast() -> None:
    img = Image.new("I;16", (2, 1))
    img.putpixel((0, 0), 1000)
    img.putpixel((1, 0), 3000)  # a dim scan: a clipping conversion would make it all white
    decoded = decode_image(encode(img, "TIFF"))
    assert (decoded.getpixel((0, 0)), decoded.getpixel((1, 0))) == (0, 255)


def test_decode_rejects_garbage() -> None:
    with pytest.raises(BadImage, match="not an image"):
        decode_image(b"\x89PNG but not really")
