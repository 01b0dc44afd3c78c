"""A job's page stays live in a real browser (issue 42): while one page submits a job, a second
browser watches the job's page, and every page's state, the downloads, the searchable PDF and the
timeline appear there without a reload, and without a console error. Real processes: daphne,
the workers and a local tesseract pod."""

from __future__ import annotations

import re

import pytest

from pods.enqueue import nudge_scaler
from pods.models import Pool
from tests.e2e.test_browser import (  # noqa: F401 (orm_beside_playwright: a fixture)
    GUARD_MS,
    SHORT_MS,
    assert_not_reloaded,
    closing_its_connections,
    log_in,
    orm_beside_playwright,
)
from tests.factories import pdf_bytes

pytestmark = [pytest.mark.e2e, pytest.mark.once_sqlite]

PAGES_DONE = "() => document.querySelectorAll('#viewer .viewer-page .status-done').length === {n}"


@closing_its_connections
@pytest.mark.usefixtures("orm_beside_playwright")
def test_a_second_browser_watches_a_job_from_submission_to_done(live_system, browser,
                                                                 admin_user, ordinary_user, tmp_path):  # fmt: skip
    url = live_system.url
    # No pod until the watcher looks: its pages are seen waiting first, then read.
    Pool.objects.filter(key="local").update(max_pods=0)
    source = tmp_path / "live-report.pdf"
    source.write_bytes(pdf_bytes())

    submitter = log_in(browser, url, "bob", "bob-pass-1")
    submitter.goto(f"{url}/jobs/new")
    submitter.set_input_files("#id_files", str(source))
    submitter.select_option("#id_pool", "local")
    submitter.check("#id_searchable_pdf")
    submitter.click("main button[type=submit]")
    submitter.wait_for_url(re.compile(r"/jobs/\d+$"))
    job_url = submitter.url

    watcher = log_in(browser, url, "alice", "alice-pass-1")  # staff: anybody's job
    errors = []
    watcher.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
    watcher.on("pageerror", lambda error: errors.append(str(error)))
    watcher.goto(job_url)
    watcher.wait_for_function("() => document.body.dataset.live === 'on'")
    watcher.evaluate("window.notReloaded = true")
    # The split makes three pages: in the first render, or pushed into the empty viewer.
    watcher.wait_for_function("() => document.querySelectorAll('#viewer .viewer-page').length === 3")
    assert watcher.locator("#viewer .viewer-page .status-done").count() == 0
    assert watcher.locator("#job-actions a", has_text="result.txt").count() == 0

    Pool.objects.filter(key="local").update(max_pods=1)
    nudge_scaler(Pool.objects.get(key="local").pk)

    watcher.wait_for_function(PAGES_DONE.format(n=3), timeout=GUARD_MS)
    watcher.wait_for_selector("#job-progress .status-done", timeout=SHORT_MS)
    watcher.wait_for_selector("#job-actions a:text('result.txt')", timeout=SHORT_MS)
    watcher.wait_for_selector("#job-documents a:text('.pdf')", timeout=GUARD_MS)  # built by the outputs workers
    watcher.wait_for_selector("#job-timeline li.event-ended", timeout=SHORT_MS)
    assert "Submitted by bob" in watcher.inner_text("#job-timeline")
    # A pushed page is a page like the others: its lines are drawn beside it once in view.
    first = watcher.locator("#viewer .viewer-page").first
    first.scroll_into_view_if_needed()
    watcher.wait_for_function("() => document.querySelector('#viewer .viewer-page ol.lines li') !== null")
    assert_not_reloaded(watcher)
    assert errors == []

    # The submitter's own page went live the same way, and still shows its "submitted" message.
    submitter.wait_for_selector("#job-progress .status-done", timeout=SHORT_MS)
    assert "submitted" in submitter.inner_text("ul.messages")
    watcher.context.close()
    submitter.context.close()
