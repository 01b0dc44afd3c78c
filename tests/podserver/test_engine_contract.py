"""The engine contract (podserver/engines/base.py): an engine that leaves out a method or a fact it
must declare cannot be made, and what it declares travels with each page's answer."""

from __future__ import annotations

import time
from typing import Any

import pytest
from PIL import Image

from podserver.answers import PageAnswer
from podserver.engines.base import Engine, page_result


class Scribe(Engine):
    """A whole engine, not named vlm, that writes Markdown."""

    name = "scribe"
    gives_markdown = True
    gives_boxes = False
    gives_confidence = False

    def load(self) -> None:
        self.languages = ["eng"]

    def ocr(self, img: Image.Image, lang: str, timeout: float) -> dict[str, Any]:
        return page_result(self, img, "# Title\n\n| a | b |", [], 80.0, time.monotonic())


def test_an_engine_missing_a_method_cannot_be_made() -> None:
    class NoOcr(Engine):
        name = "no-ocr"
        gives_markdown = gives_boxes = gives_confidence = False

        def load(self) -> None:
            pass

    with pytest.raises(TypeError, match="ocr"):
        NoOcr()


def test_an_engine_that_does_not_say_what_it_gives_cannot_be_made() -> None:
    class Unsaid(Engine):
        name = "unsaid"
        gives_boxes = gives_confidence = True

        def load(self) -> None:
            pass

        def ocr(self, img: Image.Image, lang: str, timeout: float) -> dict[str, Any]:
            return {}

    with pytest.raises(TypeError, match="gives_markdown"):
        Unsaid()


def test_an_engines_answer_says_whether_its_text_is_markdown() -> None:
    scribe = Scribe()
    scribe.load()
    answer = PageAnswer.model_validate(scribe.ocr(Image.new("L", (40, 20), 255), "eng", 5.0))

    assert (answer.engine, answer.markdown) == ("scribe", True)
    assert scribe.gives() == ["markdown"]


def test_an_answer_that_does_not_say_is_not_markdown() -> None:
    assert PageAnswer.model_validate({"text": "# not a heading", "engine": "vlm"}).markdown is False
