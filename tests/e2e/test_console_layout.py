"""Every console page in a real browser (Debian's chromium driven by Playwright; issue 42) at a
phone's 390 × 844 and a desktop's 1400 × 900: the page never scrolls sideways (a wide table
scrolls inside its own box), every link, button and field is reached by Tab, and the console
shows no error (a missing favicon's 404 would be one). One browser for the module."""

from __future__ import annotations

import pprint

import pytest
from django.conf import settings

from ocrjobs.models import Document
from tests.e2e.test_browser import closing_its_connections

# The module's one browser and daphne on the test database: test_csp_browser's fixtures.
from tests.e2e.test_csp_browser import browser, front  # noqa: F401
from tests.e2e.test_viewer_browser import read_every_page
from tests.factories import PAGES_TRUTH, image_bytes, pdf_bytes
from tests.ocrjobs.helpers import split, submit

pytestmark = [pytest.mark.e2e, pytest.mark.once_sqlite]  # the browser, not the database

SHORT_MS = 30_000
# A phone as a phone: <meta name="viewport"> takes effect only in a mobile context (without it a
# phone lays the page out 980 px wide, and shrinks it).
PHONE = {"viewport": {"width": 390, "height": 844}, "is_mobile": True, "has_touch": True, "device_scale_factor": 3}
DESKTOP = {"viewport": {"width": 1400, "height": 900}}
# Playwright evaluates an expression with eval, which the page's CSP refuses: functions only.
# How far the page reaches past the screen's width: its layout (window.innerWidth, 980 on a phone
# without the viewport meta) or its content (scrollWidth).
OVERFLOW = "() => Math.max(document.documentElement.scrollWidth, window.innerWidth) - window.screen.width"
# Each element a person can act on (shown, enabled, not taken out of the tab order), named so that
# the Tab walk below can say which it reached, even after a live push swapped the element anew.
ACTION_NAME = """(e) => [e.tagName, e.getAttribute("href"), e.name, e.id, e.type, e.value,
  (e.innerText || "").trim().slice(0, 60)].join("|")"""
ACTIONS = f"""() => {{
  const selector = "a[href], button, input:not([type=hidden]), select, textarea, summary, [tabindex]";
  return [...document.querySelectorAll(selector)].filter((e) =>
    e.getClientRects().length > 0 && !e.disabled && e.tabIndex >= 0 && getComputedStyle(e).visibility !== "hidden"
  ).map({ACTION_NAME});
}}"""
FOCUSED = f"() => document.activeElement && document.activeElement !== document.body ? ({ACTION_NAME})(document.activeElement) : null"


def unreached_by_tab(page) -> list[str]:
    """The actions of the page that pressing Tab from its start never focuses."""
    actions = page.evaluate(ACTIONS)
    page.evaluate("() => { document.activeElement && document.activeElement.blur(); window.scrollTo(0, 0); }")
    left = set(actions)
    # Some actions take more than one press (a date input's day, month and year): a bounded walk,
    # which ends once every action was reached.
    for _ in range(4 * len(actions) + 5):
        if not left:
            break
        page.keyboard.press("Tab")
        left.discard(page.evaluate(FOCUSED))
    return sorted(left)


@closing_its_connections
def test_every_console_page_fits_a_phone_and_a_desktop_and_is_worked_by_keyboard(
    front,  # noqa: F811
    browser,  # noqa: F811
    client,
    admin_user,
    local_pool,
    tmp_path,
):
    read = submit(admin_user, {"a-long-report-name-for-a-narrow-screen.pdf": pdf_bytes(PAGES_TRUTH[:1])})
    split(read)
    read_every_page(read)
    partial = submit(admin_user, {"note.png": image_bytes(["A note"]), "lost.png": image_bytes(["lost"])})
    split(partial)
    Document.objects.filter(job=partial, name="lost.png").update(status="failed", error="unreadable", page_count=0)
    partial.pages.filter(document__name="lost.png").delete()
    read_every_page(partial)
    cancelled = submit(admin_user, {"later.pdf": pdf_bytes(PAGES_TRUTH[:2])})
    split(cancelled)
    client.force_login(admin_user)
    client.post(f"/jobs/{cancelled.pk}/cancel")
    upload = tmp_path / "one.pdf"
    upload.write_bytes(pdf_bytes(PAGES_TRUTH[:1]))
    cookie = {"name": settings.SESSION_COOKIE_NAME, "value": client.cookies[settings.SESSION_COOKIE_NAME].value}

    pages = {
        "dashboard": "/",
        "job list": "/jobs/",
        "job list, filtered": "/jobs/?q=note&status=partial",
        "new job": "/jobs/new",
        "new job, its forecast": "/jobs/new",
        "job page": f"/jobs/{read.pk}",
        "partial job page": f"/jobs/{partial.pk}",
        "cancelled job page": f"/jobs/{cancelled.pk}",
        "viewer, to check": f"/jobs/{read.pk}?check=1#pages",
    }
    problems: dict[str, object] = {}
    for size in (PHONE, DESKTOP):
        for logged_in in (False, True):
            context = browser.new_context(**size)
            context.set_default_timeout(SHORT_MS)
            if logged_in:
                context.add_cookies([{**cookie, "url": front}])
            page = context.new_page()
            errors: list[str] = []
            page.on("console", lambda m, errors=errors: m.type == "error" and errors.append(m.text))
            page.on("pageerror", lambda e, errors=errors: errors.append(str(e)))
            for name, path in pages.items() if logged_in else {"login": "/login/"}.items():
                page.goto(f"{front}{path}")
                page.wait_for_load_state("load")
                assert "/login/" not in page.url or not logged_in, page.url
                if path == f"/jobs/{read.pk}":  # pdf.js draws the page once it is in view
                    page.locator(".viewer-page").first.scroll_into_view_if_needed()
                    page.wait_for_selector(".viewer-page[data-drawn='true']", state="attached")
                if name == "new job, its forecast":  # files chosen: the form shows its forecast
                    page.set_input_files("#id_files", str(upload))
                    page.wait_for_selector("#forecast table")
                where = f"{name} at {size['viewport']['width']}"
                if (overflow := page.evaluate(OVERFLOW)) > 0:
                    problems[f"{where}: scrolls sideways by"] = overflow
                if unreached := unreached_by_tab(page):
                    problems[f"{where}: not reached by Tab"] = unreached
            if errors:
                problems[f"console at {size['viewport']['width']}"] = errors
            context.close()

    assert problems == {}, pprint.pformat(problems, width=200)
