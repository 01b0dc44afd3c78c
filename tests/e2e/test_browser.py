"""The dashboard in a real browser (Debian's chromium driven by Playwright) against real
processes: daphne, qcluster workers and local tesseract pods."""

from __future__ import annotations

import functools
import re

import pytest
from django.db import connections
from django.utils import timezone

from fleetadmin.models import LoopHeartbeat
from ocrjobs.models import Job
from pods.models import Pod
from pods.providers.local import LocalProvider
from tests.factories import pdf_bytes
from tools.processes import REPO, wait_for

# The browser, not the database: once, on SQLite (fronts sharing Redis: tests/pods/test_consumers.py).
pytestmark = [pytest.mark.e2e, pytest.mark.once_sqlite]

ARTIFACTS = REPO / "test-artifacts"
GUARD_MS = 180_000  # against hangs only: a job on a cold local pod takes tens of seconds
SHORT_MS = 30_000


@pytest.fixture
def orm_beside_playwright(live_system, monkeypatch):
    # Playwright's sync API keeps an event loop on this thread between calls, so Django would
    # refuse the test's own ORM calls. Set after the children started: they never see it.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")


def closing_its_connections(test):
    """The test closes the database connections it opened. Its ORM calls run in the context
    Playwright's loop leaves the thread in, whose connections no fixture's teardown sees: one left
    open kept PostgreSQL from dropping the test database at the end of the run."""

    @functools.wraps(test)
    def run(*args, **kwargs):
        try:
            return test(*args, **kwargs)
        finally:
            connections.close_all()

    return run


def log_in(browser, url: str, username: str, password: str):
    context = browser.new_context(viewport={"width": 1440, "height": 1000})
    context.set_default_timeout(SHORT_MS)
    page = context.new_page()
    page.goto(f"{url}/")
    assert re.search(r"/login/\?next=/$", page.url), page.url
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    page.click("main button[type=submit]")
    page.wait_for_selector("#dash-pods")
    page.wait_for_function("() => document.body.dataset.live === 'on'")  # the websocket is open
    page.evaluate("window.notReloaded = true")  # gone if anything reloads the page
    return page


def assert_not_reloaded(page) -> None:
    assert page.evaluate("window.notReloaded === true"), "the dashboard reloaded"


@closing_its_connections
def test_the_dashboard_lives_in_a_browser(live_system, orm_beside_playwright, browser, admin_user, ordinary_user,
                                          tmp_path):  # fmt: skip
    url = live_system.url
    dashboard = log_in(browser, url, "alice", "alice-pass-1")
    assert dashboard.locator("#dash-alerts").is_visible() and dashboard.locator("#dash-loops").is_visible()

    # A loop-lag gauge changes without a reload: the front's own loop reports, and so does ours.
    dashboard.wait_for_selector("#dash-loops tr.loop .kind-front", timeout=SHORT_MS)
    beat = LoopHeartbeat.objects.create(name="e2e-dispatcher", kind="dispatcher", host="e2e-host", pid=4242,
                                        lag_s=0.002, worst_lag_s=0.002)  # fmt: skip
    row = f"#loop-{beat.pk}"
    dashboard.wait_for_selector(f"{row} .lag:text('2 ms')")
    LoopHeartbeat.objects.filter(pk=beat.pk).update(lag_s=3.25, worst_lag_s=3.25, stalls=1, updated_at=timezone.now())
    dashboard.wait_for_selector(f"{row} .lag:text('3.25 s')")
    assert dashboard.locator(f"{row} .gauge").get_attribute("class") == "gauge level-bad"
    assert_not_reloaded(dashboard)

    # A job submitted through the form in another tab shows up on the dashboard and finishes there.
    source = tmp_path / "browser-report.pdf"
    source.write_bytes(pdf_bytes())
    form = dashboard.context.new_page()
    form.goto(f"{url}/jobs/new")
    form.set_input_files("#id_files", str(source))
    form.select_option("#id_pool", "local")
    form.click("main button[type=submit]")
    form.wait_for_url(re.compile(r"/jobs/\d+$"))
    job_id = int(form.url.rsplit("/", 1)[1])
    assert Job.objects.get(pk=job_id).owner == admin_user
    job_row = f"#job-{job_id}"
    dashboard.wait_for_selector(job_row)
    dashboard.wait_for_selector(f"{job_row}[data-status='done']", timeout=GUARD_MS)
    assert "3 / 3 pages" in dashboard.inner_text(job_row)
    form.wait_for_selector("#job-progress .status-done", timeout=SHORT_MS)  # the job's own page too
    assert_not_reloaded(dashboard)

    # The pod that did the work is in the table with its release button.
    pod = Pod.objects.filter(pool__key="local", state=Pod.State.READY).get()
    pod_row = f"#pod-{pod.pk}"
    dashboard.wait_for_selector(f"{pod_row} button.danger")

    # A non-staff user sees the same pod but no button, and the release endpoint refuses them.
    other = log_in(browser, url, "bob", "bob-pass-1")
    other.wait_for_selector(pod_row)
    other.wait_for_timeout(1500)  # a few live updates arrive meanwhile
    assert other.locator("button.danger").count() == 0
    assert other.locator("#dash-alerts").count() == 0
    status = other.evaluate(
        """async (podId) => {
            const token = JSON.parse(document.body.getAttribute("hx-headers"))["X-CSRFToken"];
            const response = await fetch(`/pods/${podId}/release`, {method: "POST", headers: {"X-CSRFToken": token}});
            return response.status;
        }""",
        pod.pk,
    )
    assert status == 403

    # Logging out in another tab ends the dashboard's websocket, and the page goes to the login page.
    tab = other.context.new_page()
    tab.goto(f"{url}/jobs/new")
    tab.click("header form button")
    tab.wait_for_url(re.compile(r"/login/$"))
    other.wait_for_url(re.compile(r"/login/\?next=/$"), timeout=SHORT_MS)
    other.context.close()

    ARTIFACTS.mkdir(exist_ok=True)
    dashboard.screenshot(path=str(ARTIFACTS / "dashboard.png"), full_page=True)

    # Releasing the pod with the button (confirming the dialog) takes it out of the table, live.
    dialogs = []
    dashboard.once("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.accept()))
    dashboard.click(f"{pod_row} button.danger")
    dashboard.wait_for_selector(pod_row, state="detached", timeout=GUARD_MS)
    assert dialogs and pod.name in dialogs[0]
    pod.refresh_from_db()
    assert pod.state == Pod.State.TERMINATED
    assert pod.error.startswith("released: dashboard: alice")
    # A pass in the workers terminates it at the provider (the local pod's process ends), then
    # says so in its row.
    wait_for(lambda: LocalProvider().get(pod.provider_id) is None, SHORT_MS / 1000, "the pod still runs")
    wait_for(lambda: not Pod.objects.get(pk=pod.pk).terminate_pending, SHORT_MS / 1000, "its termination is pending")
    assert_not_reloaded(dashboard)
    dashboard.context.close()
