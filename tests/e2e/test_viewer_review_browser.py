"""Reviewing in the viewer in a real browser (Debian's chromium driven by Playwright, daphne with
the site's Content-Security-Policy; issue 42, item 7), at a phone's 390 × 844 and a desktop's
1400 × 900: zoom keeps each box on its words, the keys step through the lines to check, go to a
page and list themselves, each page's lines and boxes are one tab stop each, a line is corrected
from the keyboard (and a bad one refused in words under its field), nothing scrolls the page
sideways and the console stays clean. The outputs' side: tests/ocrjobs/test_corrections.py."""

from __future__ import annotations

import json
import pprint

import pytest
from django.conf import settings

from ocrjobs.models import LineCorrection, Page, lowest_line_confidence
from tests.e2e.test_browser import closing_its_connections
from tests.e2e.test_console_layout import DESKTOP, OVERFLOW, PHONE, unreached_by_tab

# The module's one browser and daphne on the test database: test_csp_browser's fixtures.
from tests.e2e.test_csp_browser import browser, front  # noqa: F401
from tests.e2e.test_viewer_browser import INK, read_every_page, with_lines_at
from tests.factories import PAGES_TRUTH, image_bytes, pdf_bytes
from tests.ocrjobs.helpers import split, submit

pytestmark = [pytest.mark.e2e, pytest.mark.once_sqlite]  # the browser, not the database

SHORT_MS = 30_000
# Where a box sits on its sheet, as shares of the sheet's size (zoom must not move it).
BOX_SHARE = """([article, line]) => {
    const sheet = document.querySelector(`#${article} .viewer-boxes`).getBoundingClientRect();
    const box = document.querySelector(`#${article} .box[data-line="${line}"]`).getBoundingClientRect();
    return [(box.left - sheet.left) / sheet.width, (box.top - sheet.top) / sheet.height,
            box.width / sheet.width, sheet.width];
}"""
FOCUSED_LINE = """() => { const e = document.activeElement;
    return e && e.dataset.line !== undefined ? [e.tagName, e.closest(".viewer-page").id, e.dataset.line] : null; }"""
TAB_STOPS = """(article) => [...document.querySelectorAll(`#${article} li[data-line], #${article} .box`)]
    .filter((e) => e.tabIndex === 0).map((e) => e.tagName)"""


def faint(page: Page, line: int) -> None:
    """Line ``line`` of the page read at 41, as a faint line would be."""
    result = page.read_result()
    result["lines"][line]["confidence"] = 41.0
    Page.objects.filter(pk=page.pk).update(
        result=json.dumps(result), min_line_confidence=lowest_line_confidence(result)
    )


@closing_its_connections
def test_the_viewer_zooms_steps_through_lines_to_check_and_corrects_by_keyboard_on_a_phone_and_a_desktop(
    front,  # noqa: F811
    browser,  # noqa: F811
    client,
    ordinary_user,
    local_pool,
):
    job = submit(ordinary_user, {"report.pdf": pdf_bytes(PAGES_TRUTH[:2]), "note.png": image_bytes(["A note."])})
    split(job)
    read_every_page(job)
    note = job.pages.get(document__name="note.png")
    with_lines_at(note, 95.0)
    first, second = job.pages.filter(document__name="report.pdf").order_by("number")
    faint(first, 1)
    faint(second, 0)
    engine_reading = first.read_result()["lines"][1]["text"]
    client.force_login(ordinary_user)
    cookie = {"name": settings.SESSION_COOKIE_NAME, "value": client.cookies[settings.SESSION_COOKIE_NAME].value}
    article = f"viewer-page-{first.pk}"
    problems: dict[str, object] = {}

    for size in (PHONE, DESKTOP):
        width = size["viewport"]["width"]
        context = browser.new_context(**size)
        context.set_default_timeout(SHORT_MS)
        context.add_cookies([{**cookie, "url": front}])
        page = context.new_page()
        errors: list[str] = []
        page.on("console", lambda m, errors=errors: m.type == "error" and errors.append(m.text))
        page.on("pageerror", lambda e, errors=errors: errors.append(str(e)))
        page.goto(f"{front}/jobs/{job.pk}")
        page.locator(f"#{article}").scroll_into_view_if_needed()
        page.wait_for_selector(f"#{article}[data-drawn='true']")
        page.wait_for_selector("#viewer-lines-count:not([hx-get])")  # the job's count, asked for once shown
        if width == 390:  # a phone shows the page across the screen, its text under it
            assert page.evaluate(BOX_SHARE, [article, 1])[3] > 300
        assert page.locator("#viewer-lines-count").inner_text() == "2 lines under 80"

        # Lines to check: j goes to the first (its box marked with it), j again to the next page's, k back.
        page.keyboard.press("j")
        assert page.evaluate(FOCUSED_LINE) == ["LI", article, "1"], width
        assert "focused" in page.locator(f"#{article} .box[data-line='1']").get_attribute("class")
        page.keyboard.press("j")
        assert page.evaluate(FOCUSED_LINE) == ["LI", f"viewer-page-{second.pk}", "0"], width
        page.keyboard.press("k")
        assert page.evaluate(FOCUSED_LINE) == ["LI", article, "1"], width
        # One tab stop for a page's lines and one for its boxes; the arrows move between them.
        assert page.evaluate(TAB_STOPS, article) == ["DIV", "LI"], width
        page.keyboard.press("ArrowDown")
        assert page.evaluate(FOCUSED_LINE) == ["LI", article, "2"], width
        assert sorted(page.evaluate(TAB_STOPS, article)) == ["DIV", "LI"]
        page.keyboard.press("ArrowUp")

        # Zoom in twice: the sheet grows, each box keeps its share of it, and sits on ink when redrawn.
        before = page.evaluate(BOX_SHARE, [article, 1])
        page.keyboard.press("+")
        page.locator("[data-zoom='in']").click()
        page.wait_for_function(  # drawn again at its new size
            f"() => document.querySelector('#{article} canvas').width > {before[3] * 1.5}"
            f" && document.querySelector('#{article}').dataset.drawn === 'true'",
            polling=100,
        )
        after = page.evaluate(BOX_SHARE, [article, 1])
        assert after[3] == pytest.approx(before[3] * 1.5625, rel=0.02), width
        assert after[:3] == pytest.approx(before[:3], abs=0.002), width
        assert page.evaluate(INK, [article, 1]) > 0.05, width
        if (overflow := page.evaluate(OVERFLOW)) > 0:
            problems[f"zoomed at {width}: the page scrolls sideways by"] = overflow
        # 100%: a pixel read is a pixel shown (the page was read 1700 px wide at 200 DPI); 0 fits again.
        page.keyboard.press("1")
        page.wait_for_function("() => document.querySelector('#viewer-zoom').textContent === '100%'")
        assert page.evaluate(BOX_SHARE, [article, 1])[3] == pytest.approx(1700, abs=2), width
        page.keyboard.press("0")
        assert page.evaluate(BOX_SHARE, [article, 1])[3] == pytest.approx(before[3], abs=1), width
        assert page.locator("#viewer-zoom").inner_text() == "fit"

        # g: go to a page by its number.
        page.keyboard.press("g")
        page.keyboard.type("2")
        page.keyboard.press("Enter")
        page.wait_for_function(f"() => document.activeElement.id === 'viewer-page-{second.pk}'")
        # Each document has a page 1: Go takes the report's, Go again the note's.
        page.locator("#viewer-goto-page").fill("1")
        page.keyboard.press("Enter")
        page.wait_for_function(f"() => document.activeElement.id === '{article}'")
        page.locator("#viewer-goto-page").focus()
        page.keyboard.press("Enter")
        page.wait_for_function(f"() => document.activeElement.id === 'viewer-page-{note.pk}'")
        # ?: the keys, listed; Escape closes the list.
        page.keyboard.press("?")
        assert page.locator("#viewer-keys dl").is_visible()
        page.keyboard.press("Escape")
        assert not page.locator("#viewer-keys dl").is_visible()

        if unreached := unreached_by_tab(page):
            problems[f"at {width}: not reached by Tab"] = unreached
        if (overflow := page.evaluate(OVERFLOW)) > 0:
            problems[f"at {width}: the page scrolls sideways by"] = overflow

        if size is DESKTOP:
            # e corrects the focused line: a blank one is refused in words, Escape leaves it, Enter saves.
            page.locator(f"#{article} li[data-line='1']").focus()
            page.keyboard.press("e")
            field = page.locator(f"#{article} li[data-line='1'] form.correct input")
            field.fill("   ")
            page.keyboard.press("Enter")
            page.wait_for_selector(f"#{article} form.correct .error:not(:empty)")
            assert (
                page.locator(f"#{article} form.correct .error").inner_text() == "text: a corrected line cannot be empty"
            )
            page.keyboard.press("Escape")
            assert page.locator(f"#{article} form.correct").count() == 0
            assert not LineCorrection.objects.exists()
            # (the browser logs the refusal's 400 itself: the one console error that is meant)
            errors.remove("Failed to load resource: the server responded with a status of 400 (Bad Request)")
            page.keyboard.press("e")
            field.fill("Corrected by a person")
            page.keyboard.press("Enter")
            page.wait_for_selector(f"#{article} li[data-line='1'].corrected")
            assert page.locator(f"#{article} li[data-line='1'] .text").inner_text() == "Corrected by a person"
            assert page.locator(f"#{article} .box[data-line='1']").get_attribute("title") == (
                f"Corrected by a person (corrected; the engine read: {engine_reading})"
            )
            assert page.locator("#viewer-lines-count").inner_text() == "1 line under 80"
            assert page.evaluate(FOCUSED_LINE) == ["LI", article, "1"]  # back on the line, for the next key
            correction = LineCorrection.objects.get()
            assert (correction.text, correction.engine_text, correction.by) == (
                "Corrected by a person",
                engine_reading,
                ordinary_user,
            )
            # Reloaded, the line is still corrected, and no longer one to check.
            page.reload()
            page.locator(f"#{article}").scroll_into_view_if_needed()
            page.wait_for_selector(f"#{article} li[data-line='1'].corrected")
            page.keyboard.press("j")
            assert page.evaluate(FOCUSED_LINE) == ["LI", f"viewer-page-{second.pk}", "0"]

        if errors:
            problems[f"console at {width}"] = errors
        context.close()

    assert problems == {}, pprint.pformat(problems, width=200)
