"""A page's stored result read once, typed (ocrjobs/results.py): rows stored before a field
existed still read, a field of the wrong type takes its default, numbers are kept as stored."""

from __future__ import annotations

import json

from ocrjobs.models import Page
from ocrjobs.results import StoredResult


def test_an_old_row_without_the_newer_fields_reads_with_their_defaults():
    old = StoredResult.from_json(json.dumps({"text": "hello\n", "lines": [], "confidence": 90.0}))

    assert old == StoredResult(text="hello\n", confidence=90.0)
    assert (old.markdown, old.warnings, old.cascade, old.engine_text, old.corrected_lines) == (False, [], None, None, 0)


def test_a_field_of_the_wrong_type_takes_its_default_and_numbers_stay_as_stored():
    read = StoredResult.from_dict({"text": None, "lines": [{"text": "a"}, "junk"], "width": "wide", "height": 600,
                                   "confidence": True, "warnings": ["w", 3], "markdown": "yes", "cascade": {},
                                   "rotation": 90, "skew": 1.5})  # fmt: skip

    assert (read.text, read.lines, read.width, read.height, read.confidence) == ("", [{"text": "a"}], None, 600, None)
    assert (read.warnings, read.markdown, read.cascade, read.rotation, read.skew) == (["w"], False, None, 90, 1.5)
    assert isinstance(read.height, int) and StoredResult.from_dict([1, 2]) == StoredResult()


def test_only_a_done_page_with_a_result_has_one():
    stored = json.dumps({"text": "x", "engine": "scribe", "markdown": True})

    assert StoredResult.from_row(Page(status=Page.Status.DONE, result=stored)).markdown is True
    assert StoredResult.from_row(Page(status=Page.Status.DONE, result="")) is None
    assert StoredResult.from_row(Page(status=Page.Status.RUNNING, result=stored)) is None


def test_a_reading_without_lines_gives_its_texts_lines():
    reading = StoredResult.from_dict({"text": "one\n\n two \n", "lines": [{"text": " "}]})

    assert reading.lines_or_text() == [{"text": "one"}, {"text": " two "}]
    assert reading.with_lines([{"text": "a"}, {"text": "b"}]).text == "a\nb"
