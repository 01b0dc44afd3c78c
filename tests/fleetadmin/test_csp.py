"""The pages' Content-Security-Policy (issue 38, N3 and N9): every page the console serves carries
it, it allows no inline script, eval or inline style, and no template relies on any of them (an
inline <script>, an on*= handler, a style="" attribute, an htmx trigger filter). What a browser
does with it is in tests/e2e/test_csp_browser.py."""

from __future__ import annotations

import asyncio
import re

import pytest
from csp.middleware import CSPMiddleware
from django.conf import settings
from django.test import Client
from django.utils.module_loading import import_string

from fleetadmin.staticpolicy import StaticPolicy
from ocrjobs.models import Document
from tests.factories import pdf_bytes
from tests.ocrjobs.helpers import split, submit
from tools.processes import REPO

DIRECTIVES = {
    "default-src": "'self'",
    "script-src": "'self'",
    "style-src": "'self'",
    "img-src": "'self' data: blob:",
    "connect-src": "'self'",
    "object-src": "'none'",
    "base-uri": "'none'",
    "form-action": "'self'",
    "frame-ancestors": "'none'",
}
# Every template the project renders, its own and its apps'.
TEMPLATES = sorted(
    path for folder in [REPO / "templates", *REPO.glob("*/templates")] for path in folder.rglob("*.html")
)
INLINE_SCRIPT = re.compile(r"<script(?![^>]*\bsrc=)(?![^>]*type=\"application/json\")[^>]*>", re.I)
HANDLER = re.compile(r"\son[a-z]+\s*=", re.I)
STYLE = re.compile(r"\sstyle\s*=|<style[\s>]", re.I)
HTMX_SCRIPT = re.compile(r"\b(hx-on[:-]|hx-vals=['\"]js:|hx-vars=)|hx-trigger=\"[^\"]*\[", re.I)


def policy(response) -> dict[str, str]:
    header = response.headers.get("Content-Security-Policy", "")
    return dict(part.strip().split(" ", 1) for part in header.split(";") if part.strip())


def pages(job) -> list[str]:
    return ["/login/", "/", "/jobs/", "/jobs/new", f"/jobs/{job.pk}", f"/jobs/{job.pk}/viewer",
            f"/jobs/{job.pk}/progress", "/dashboard/sections", "/admin/", "/v1/jobs"]  # fmt: skip


@pytest.fixture
def job(admin_user, local_pool):
    job = submit(admin_user, {"report.pdf": pdf_bytes()})
    split(job)
    return job


def test_every_page_sends_the_policy_with_no_inline_script_eval_or_inline_style(admin_user, job):
    client = Client()
    assert policy(client.get("/login/")) == DIRECTIVES  # before logging in too
    client.force_login(admin_user)
    for url in pages(job):
        response = client.get(url)
        assert response.status_code == 200, url
        assert policy(response) == DIRECTIVES, url
    header = client.get("/").headers["Content-Security-Policy"]
    assert "unsafe" not in header  # no 'unsafe-inline', 'unsafe-eval', 'unsafe-hashes'


def test_a_served_document_keeps_its_own_sandboxed_policy(admin_user, job):
    client = Client()
    client.force_login(admin_user)
    document = Document.objects.get(job=job)
    response = client.get(f"/jobs/{job.pk}/documents/{document.pk}")
    assert response.status_code == 200
    assert "sandbox" in response.headers["Content-Security-Policy"]


def test_the_settings_name_the_policy_django_csp_sends():
    # django-csp's middleware, run on the front's loop (fleetadmin/middleware.py)
    assert any(issubclass(import_string(path), CSPMiddleware) for path in settings.MIDDLEWARE)
    assert {k: " ".join(v) for k, v in settings.CONTENT_SECURITY_POLICY["DIRECTIVES"].items()} == DIRECTIVES


def test_no_template_has_inline_script_handlers_styles_or_htmx_script():
    assert len(TEMPLATES) > 20, TEMPLATES
    found = []
    for path in TEMPLATES:
        text = path.read_text()
        for rule in (INLINE_SCRIPT, HANDLER, STYLE, HTMX_SCRIPT):
            found += [f"{path.relative_to(REPO)}: {match.group(0)}" for match in rule.finditer(text)]
    assert found == []


@pytest.mark.parametrize(
    "markup",
    ['<script>alert(1)</script>', '<form onsubmit="return confirm(1)">', '<span style="width: 3%">',
     '<style>p{}</style>', '<div hx-trigger="every 10s [window.x]">', '<div hx-on:click="x()">'],
)  # fmt: skip
def test_the_template_check_finds_each_kind(markup):
    assert any(rule.search(markup) for rule in (INLINE_SCRIPT, HANDLER, STYLE, HTMX_SCRIPT))
    assert not any(rule.search('<script src="/static/x.js" defer></script>') for rule in (INLINE_SCRIPT, HANDLER))


# What compiles text as script: eval, Function and new Function (with or without `new`).
COMPILES_SCRIPT = re.compile(r"(?<![\w.$])(?:eval|Function)\s*\(")
PDFJS = REPO / "static" / "vendor" / "pdfjs-6.5.438"


def test_the_vendored_pdfjs_compiles_nothing_as_script_and_the_viewer_says_so():
    # N9: pdf.js before 5 compiled a PDF's PostScript functions (and, before 4.2.67, glyph paths:
    # CVE-2024-4367) with `new Function` unless isEvalSupported was false. The vendored build has
    # no such path (it compiles PostScript to WebAssembly or walks it); a later one that brings one
    # back fails here, and the page's CSP refuses it meanwhile. The viewer still sets the switch.
    for path in (PDFJS / "pdf.min.mjs", PDFJS / "pdf.worker.min.mjs"):
        assert COMPILES_SCRIPT.findall(path.read_text()) == [], path
    assert "isEvalSupported: false" in (REPO / "static" / "viewer.js").read_text()
    # The check finds it where it is: htmx evaluates hx-on and trigger filters (allowEval, off here).
    assert len(COMPILES_SCRIPT.findall((REPO / "static" / "vendor" / "htmx-2.0.11.min.js").read_text())) >= 3


def _answer(app, path: str) -> dict[bytes, bytes]:
    sent: list[dict] = []

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)

    asyncio.run(app({"type": "http", "path": path, "method": "GET", "headers": []}, receive, send))
    return dict(sent[0]["headers"])


async def _file(scope, receive, send):
    headers = [(b"content-type", b"text/javascript")]
    if scope["path"].endswith("own.js"):
        headers.append((b"Content-Security-Policy", b"sandbox"))
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": b""})


def test_static_files_carry_a_policy_that_refuses_eval_and_allows_webassembly_only():
    # pdf.js's worker runs under the policy its own response carries (chromium; the e2e test
    # checks the real front's): without one, eval was allowed there.
    app = StaticPolicy(_file)
    worker = _answer(app, "/static/vendor/pdfjs-6.5.438/pdf.worker.min.mjs")[b"content-security-policy"]
    directives = dict(part.split(" ", 1) for part in worker.decode().split("; "))
    assert directives["script-src"] == "'self' 'wasm-unsafe-eval'"
    assert directives["default-src"] == "'self'" and "unsafe-eval'" not in worker.decode().replace("wasm-unsafe", "")
    assert b"content-security-policy" not in _answer(app, "/jobs/1")  # django-csp's
    assert _answer(app, "/static/own.js")[b"Content-Security-Policy"] == b"sandbox"  # kept, not doubled
    assert b"content-security-policy" not in _answer(app, "/static/own.js")
