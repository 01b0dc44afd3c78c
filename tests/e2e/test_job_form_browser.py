"""The new-job form in a real browser (Debian's chromium driven by Playwright; issue 42, item 6)
at a phone's 390 × 844 and a desktop's 1400 × 900: it never scrolls sideways, every field is
reached by Tab, the console shows no error, the forecast marks the pool and sizing the job takes,
and a refused submit shows the form again with the files chosen and every field as sent."""

from __future__ import annotations

import pytest
from django.conf import settings

from ocrjobs.models import Job
from tests.e2e.test_browser import closing_its_connections
from tests.e2e.test_console_layout import DESKTOP, OVERFLOW, PHONE, SHORT_MS, unreached_by_tab

# The module's one browser and daphne on the test database: test_csp_browser's fixtures.
from tests.e2e.test_csp_browser import browser, front  # noqa: F401
from tests.factories import PAGES_TRUTH, pdf_bytes

pytestmark = [pytest.mark.e2e, pytest.mark.once_sqlite]  # the browser, not the database


@pytest.mark.parametrize("size", [PHONE, DESKTOP], ids=["390", "1400"])
@closing_its_connections
def test_the_job_form_fits_is_worked_by_keyboard_and_keeps_what_a_refusal_sent(
    front,  # noqa: F811
    browser,  # noqa: F811
    client,
    ordinary_user,
    local_pool,
    tmp_path,
    size,
):
    files = []
    for name, pages in (("first-report-with-a-long-name.pdf", 2), ("second.pdf", 1)):
        path = tmp_path / name
        path.write_bytes(pdf_bytes(PAGES_TRUTH[:pages]))
        files.append(str(path))
    client.force_login(ordinary_user)
    cookie = {"name": settings.SESSION_COOKIE_NAME, "value": client.cookies[settings.SESSION_COOKIE_NAME].value}
    context = browser.new_context(**size)
    context.set_default_timeout(SHORT_MS)
    context.add_cookies([{**cookie, "url": front}])
    page = context.new_page()
    errors: list[str] = []
    page.on("console", lambda m: m.type == "error" and m.text.find("400 (Bad Request)") < 0 and errors.append(m.text))
    page.on("pageerror", lambda e: errors.append(str(e)))

    page.goto(f"{front}/jobs/new")
    deadline = page.locator("#id_deadline")
    assert deadline.get_attribute("type") == "datetime-local" and deadline.get_attribute("min")
    assert page.locator("label[for=id_pool]").inner_text() == "Pool"
    page.set_input_files("#id_files", files)
    chosen = page.wait_for_selector("#forecast tr.chosen")
    assert "local" in chosen.inner_text() and "balanced" in chosen.inner_text()
    assert page.evaluate(OVERFLOW) <= 0, "the form scrolls sideways"
    assert unreached_by_tab(page) == []

    # Refused (a language that is no language): the form again, with the files and the fields.
    # (A change of priority asks for the forecast again, which would name the language first and
    # hold the submit: the language is typed last, and a change lets the submit go.)
    page.select_option("#id_priority", "cheapest")
    page.wait_for_selector("#forecast tr.chosen")
    page.fill("#id_max_dollars", "2.50")
    page.fill("#id_languages", "eng; rm")
    page.click("button[type=submit]")
    assert "languages must look like" in page.wait_for_selector(".form-errors").inner_text()
    kept = page.locator("input[name=kept]")
    assert kept.count() == 2 and all(kept.nth(i).is_checked() for i in range(2))
    assert "first-report-with-a-long-name.pdf" in page.locator(".kept-files").inner_text()
    # (the forecast of the kept files is asked for again at once: here it names the same refusal)
    assert "languages must look like" in page.wait_for_selector("#forecast .error").inner_text()
    assert page.locator("button[type=submit]").is_disabled()  # (until the form changes)
    assert page.input_value("#id_max_dollars") == "2.50" and page.input_value("#id_priority") == "cheapest"
    assert page.evaluate(OVERFLOW) <= 0, "the refused form scrolls sideways"
    assert unreached_by_tab(page) == []

    # Fixed and sent again without choosing the files anew: the job has both documents.
    page.fill("#id_languages", "eng")
    page.click("button[type=submit]")
    page.wait_for_url(f"{front}/jobs/*")
    job = Job.objects.get()
    assert [(d.name, d.page_count) for d in job.documents.order_by("position")] == [
        ("first-report-with-a-long-name.pdf", 2),
        ("second.pdf", 1),
    ]
    assert (job.priority, str(job.max_dollars)) == ("cheapest", "2.50")
    assert errors == []
    context.close()
