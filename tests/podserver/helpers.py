"""Page rendering and text comparison shared by the pod server tests."""

from __future__ import annotations

import difflib
import io
import random
import struct
import zlib

from PIL import Image, ImageDraw, ImageFont

FONT = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf"
PAGE_LINES = [
    "The quick brown fox jumps over the lazy dog.",
    "Pack my box with five dozen liquor jugs.",
    "Sphinx of black quartz, judge my vow 1234567890.",
]


def render(lines: list[str], size: int = 32) -> Image.Image:
    """Black DejaVu text on white with margins and leading, like a clean scan."""
    font = ImageFont.truetype(FONT, size)
    width = max(int(font.getlength(line)) for line in lines) + 2 * 40
    height = len(lines) * int(size * 1.7) + 2 * 30
    img = Image.new("L", (width, height), 255)
    draw = ImageDraw.Draw(img)
    for i, line in enumerate(lines):
        draw.text((40, 30 + i * int(size * 1.7)), line, font=font, fill=0)
    return img


def encode(img: Image.Image, fmt: str = "PNG", **params: object) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format=fmt, **params)
    return buf.getvalue()


def png_header_only(width: int, height: int) -> bytes:
    """A PNG claiming huge dimensions without pixel data: a decompression bomb probe."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", b"") + chunk(b"IEND", b"")


WORDS = (
    "the quick brown fox jumps over lazy dog pack my box with five dozen liquor jugs sphinx of black "
    "quartz judge vow invoice total amount paid number"
).split()


def page_lines(count: int = 14, seed: int = 3, words: int = 8) -> list[str]:
    rnd = random.Random(seed)
    return [" ".join(rnd.choice(WORDS) for _ in range(words)) for _ in range(count)]


def letter_page(lines: list[str], leading: int = 62) -> Image.Image:
    """A page of text at about 200 DPI, as a scan of a letter would be read (``leading``: pixels
    from line to line; 40 is single-spaced)."""
    font = ImageFont.truetype(FONT, 30)
    width = max(1500, 240 + max(int(font.getlength(line)) for line in lines))
    img = Image.new("L", (width, 120 + leading * len(lines) + 120), 255)
    draw = ImageDraw.Draw(img)
    for i, line in enumerate(lines):
        draw.text((120, 120 + i * leading), line, font=font, fill=0)
    return img


def word_accuracy(got: str, truth: list[str]) -> float:
    """The share of the truth's words read, in order (difflib on words, no junk heuristic)."""
    return difflib.SequenceMatcher(None, got.split(), " ".join(truth).split(), autojunk=False).ratio()
