"""Tesseract's word grouping and the image normalisation, on their own."""

from __future__ import annotations

import pytest
from PIL import Image

from podserver.engines.tesseract import group_words
from podserver.pages import BadImage, decode_image

from .helpers import encode


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
    assert confidence == pytest.approx((90 + 80 + 70 + 60 + 100) / 5)


def test_group_words_without_words() -> None:
    assert group_words({}) == ("", [], 0.0)
    assert group_words(table((1, 0, 0, 0, 0, 9, 9, -1, ""))) == ("", [], 0.0)


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
