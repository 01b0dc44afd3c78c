"""A page whose own text layer is mojibake or does not map to Unicode is read, and the pod's
answer says so (issue 40, item 3): ``text_layer: unusable`` and a warning."""

from __future__ import annotations

import hashlib

import httpx
import pytest

from podserver import pages
from podserver.textlayer import text_layer_problem
from tests.factories import PAGES_TRUTH, accuracy
from tests.textlayers import broken_font_pdf, pretexted_pdf

pytestmark = pytest.mark.once_sqlite


@pytest.mark.parametrize(
    ("text", "unusable"),
    [
        ("Quarterly report of the river authority", False),
        ("北京市的水位在三月上涨了十二厘米", False),  # real CJK text
        ("Ünïcödé façade — “quoted” • bullet", False),
        ("", False),
        ("a hyphen\x02ated line, as pdfium marks one", False),
        ("䴀甀氀琀椀氀椀渀最甀愀氀", True),  # "Multilingual", each code shifted into the high byte
        ("\ufffd\ufffd\ufffd report \ufffd\ufffd\ufffd", True),
        ("\ue001\ue002\ue003\ue004 ab", True),  # private use
        ("\x01\x03\x04\x05\x06 abc", True),  # glyph ids as control codes
    ],
)
def test_a_text_layer_is_judged_by_its_characters(text, unusable) -> None:
    assert (text_layer_problem(text) is not None) is unusable


def test_characters_the_reader_could_not_map_make_a_layer_unusable() -> None:
    assert "do not map to Unicode" in text_layer_problem("abcdefghij", unmapped=5)
    assert text_layer_problem("abcdefghijklmnopqrstuvwxyz", unmapped=1) is None


def test_a_broken_font_page_renders_with_its_problem_and_a_good_layer_without(tmp_path) -> None:
    broken, good = tmp_path / "broken.pdf", tmp_path / "good.pdf"
    broken.write_bytes(broken_font_pdf(PAGES_TRUTH[0]))
    good.write_bytes(pretexted_pdf(PAGES_TRUTH[0]))

    assert "mojibake" in pages.render_pdf_page(broken, 1, 100).info[pages.TEXT_LAYER_PROBLEM]
    assert pages.TEXT_LAYER_PROBLEM not in pages.render_pdf_page(good, 1, 100).info


def test_the_pod_reads_a_broken_font_page_and_warns(start_server) -> None:
    _, url = start_server()  # its renderer's child processes: the real path
    data = broken_font_pdf(PAGES_TRUTH[0])
    sha = hashlib.sha256(data).hexdigest()
    assert httpx.put(f"{url}/v1/documents/{sha}", content=data, timeout=30).status_code == 201

    body = httpx.post(f"{url}/v1/ocr", json={"document": sha, "page": 1, "dpi": 200}, timeout=60).json()

    assert accuracy(body["text"], " ".join(PAGES_TRUTH[0])) >= 0.9
    assert body["text_layer"] == "unusable"
    assert any("text layer is unusable" in warning and "mojibake" in warning for warning in body["warnings"])
