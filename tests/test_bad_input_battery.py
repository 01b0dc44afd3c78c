"""Bad input the endpoint tests do not cover yet: image bombs at full size, file names on the
form, malformed and mistyped JSON on every JSON POST endpoint, bodies over the limits, ids
too large for the database, and paths under /v1/ that match no endpoint.

Each gets a clear 4xx (``{"error": ...}`` for the API, a form error on a page) and leaves
nothing behind. What is already covered lives beside its endpoint: tests/ocrjobs/
test_submit_api.py (files, pools, languages, sizes, names, tokens), test_job_form.py,
test_jobs_api.py and tests/pods/test_control_api.py (scale and release basics).
"""

from __future__ import annotations

import html
import io
import json
import os
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import pypdfium2 as pdfium
import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client
from django_q.brokers import get_broker

from ocrjobs.models import Document
from pods.models import Pod, ScaleRequest
from tests.factories import PAGES_TRUTH, pdf_bytes
from tests.helpers import auth
from tests.ocrjobs.helpers import assert_nothing_made, files_under
from tests.ocrjobs.test_job_form import assert_no_job_and_the_files_kept
from tests.ocrjobs.test_submit_api import assert_refused, raw_multipart

pytestmark = pytest.mark.usefixtures("local_pool")

ROOT = Path(__file__).resolve().parents[1]


# --- image bombs: headers that claim 10^10 pixels, a few hundred bytes on disk --------------------


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png_bomb(width: int = 100_000, height: int = 100_000) -> bytes:
    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", header) + _png_chunk(b"IDAT", zlib.compress(b"\0" * 1000))
            + _png_chunk(b"IEND", b""))  # fmt: skip


def tiff_bomb(width: int = 100_000, height: int = 100_000) -> bytes:
    tags = [(256, 4, 1, width), (257, 4, 1, height), (258, 3, 1, 8), (259, 3, 1, 1), (262, 3, 1, 1),
            (273, 4, 1, 200), (277, 3, 1, 1), (278, 4, 1, height), (279, 4, 1, 1)]  # fmt: skip
    ifd = struct.pack("<H", len(tags)) + b"".join(struct.pack("<HHII", *tag) for tag in tags) + struct.pack("<I", 0)
    head = b"II*\x00" + struct.pack("<I", 8) + ifd
    return head + b"\0" * (201 - len(head))


def jpeg_bomb(width: int = 65_500, height: int = 65_500) -> bytes:
    frame = b"\xff\xc0" + struct.pack(">HBHHB", 11, 8, height, width, 1) + b"\x01\x11\x00"
    scan = b"\xff\xda" + struct.pack(">HB", 8, 1) + b"\x01\x00\x00\x3f\x00"
    return b"\xff\xd8" + frame + scan + b"\x00" * 16 + b"\xff\xd9"


def pdf_with_a_page_of(points: float) -> bytes:
    """A valid one-page PDF whose page is ``points`` square (14,400 pt = 200 inches, the PDF maximum)."""
    document = pdfium.PdfDocument.new()
    document.new_page(points, points)
    buffer = io.BytesIO()
    document.save(buffer)
    return buffer.getvalue()


BOMBS = {
    "bomb.png": (png_bomb(), "100000×100000"),
    "bomb.tif": (tiff_bomb(), "100000×100000"),
    "bomb.jpg": (jpeg_bomb(), "65500×65500"),
}


@pytest.mark.parametrize("name", list(BOMBS))
def test_an_image_bomb_at_the_default_limit_is_refused_unread_over_the_api(client, submit_token, media_root, name):
    content, size = BOMBS[name]
    assert len(content) < 2000

    response = client.post("/v1/jobs", {"files": [SimpleUploadedFile(name, content)]}, headers=auth(submit_token))

    assert_refused(response, 413, name, size, "100000000 pixels")
    assert_nothing_made(media_root)


def test_an_image_bomb_on_the_form_is_a_form_error(client, ordinary_user, media_root):
    client.force_login(ordinary_user)

    response = client.post("/jobs/new", {"files": [SimpleUploadedFile("bomb.png", png_bomb())], "pool": "local",
                                         "languages": "eng"})  # fmt: skip

    assert response.status_code == 400
    assert "bomb.png: 100000×100000 pixels is over the limit" in html.unescape(response.content.decode())
    assert_no_job_and_the_files_kept(media_root)  # (the form keeps the files chosen, an hour)


def test_the_bombs_are_refused_with_pillows_process_wide_limit_left_as_it_was():
    """Pillow's MAX_IMAGE_PIXELS holds for every thread and library of a process: importing the
    services (as the front and the workers do) leaves it as Pillow set it, so the bomb tests above
    pass with it in place (it refuses these bombs in Image.open)."""
    code = ("from PIL import Image; before = Image.MAX_IMAGE_PIXELS; import django; django.setup(); "
            "import ocrjobs.tasks, ocrjobs.api, ocrjobs.views; print(before, Image.MAX_IMAGE_PIXELS)")  # fmt: skip
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "fleetadmin.settings"}
    run = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True, timeout=60)

    assert run.returncode == 0, run.stderr
    before, after = run.stdout.split()
    assert after == before != "None"
    # The 10^10-pixel bombs are over twice Pillow's limit: Image.open would refuse them itself.
    assert 2 * int(before) < 100_000 * 100_000


def test_a_pdf_page_that_would_render_past_the_pixel_limit_is_taken_not_refused(
    client, submit_token, media_root, settings
):
    # 14,400 pt at the render DPI (200) is 40,000 × 40,000 pixels: the pod renders it at the
    # largest DPI under its pixel limit, with a warning (issue 40; tests/podserver/test_render_fit.py).
    # Nothing is rendered at submission.
    assert (14_400 / 72 * settings.OCR_RENDER_DPI) ** 2 > settings.OCR_MAX_IMAGE_PIXELS

    response = client.post("/v1/jobs", {"files": [SimpleUploadedFile("poster.pdf", pdf_with_a_page_of(14_400))]},
                           headers=auth(submit_token))  # fmt: skip

    assert response.status_code == 201, response.content
    assert response.json()["documents"][0]["page_count"] == 1


def xfa_form(*, dynamic: bool) -> bytes:
    """A PDF whose form is XFA: dynamic (NeedsRendering, its pages made by the form software) or
    static (its pages in the PDF, the XFA beside them)."""
    import pikepdf

    pdf = pikepdf.open(io.BytesIO(pdf_bytes(PAGES_TRUTH[:1])))
    template = pdf.make_stream(b'<xdp:xdp xmlns:xdp="http://ns.adobe.com/xdp/"><template/></xdp:xdp>')
    pdf.Root.AcroForm = pikepdf.Dictionary(Fields=pikepdf.Array(), XFA=pikepdf.Array(["template", template]))
    if dynamic:
        pdf.Root.NeedsRendering = True
    out = io.BytesIO()
    pdf.save(out)
    return out.getvalue()


def test_a_dynamic_xfa_form_is_refused_with_a_message_that_says_so(client, submit_token, media_root):
    response = client.post("/v1/jobs", {"files": [SimpleUploadedFile("form.pdf", xfa_form(dynamic=True))]},
                           headers=auth(submit_token))  # fmt: skip

    assert_refused(response, 422, "form.pdf", "a dynamic XFA form", "print it to a PDF")
    assert_nothing_made(media_root)


def test_a_static_xfa_form_is_read_from_its_pages(client, submit_token):
    response = client.post("/v1/jobs", {"files": [SimpleUploadedFile("form.pdf", xfa_form(dynamic=False))]},
                           headers=auth(submit_token))  # fmt: skip

    assert response.status_code == 201, response.content


# --- file names on the form ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sent", "stored"),
    [("../../etc/passwd.pdf", "passwd.pdf"), ("..\\..\\boot.ini.pdf", "boot.ini.pdf"),
     ("a\x00b\u202egnp.pdf", "abgnp.pdf"), (".hidden.pdf", "hidden.pdf"), ("x" * 300 + ".pdf", "x" * 200)],
)  # fmt: skip
def test_a_file_name_on_the_form_is_kept_clean_and_inside_media_root(
    client, ordinary_user, media_root, tmp_path, sent, stored
):
    client.force_login(ordinary_user)
    body, content_type = raw_multipart([("files", sent, pdf_bytes(PAGES_TRUTH[:1])), ("pool", None, b"local"),
                                        ("languages", None, b"eng")])  # fmt: skip

    response = client.generic("POST", "/jobs/new", body, content_type=content_type)

    assert response.status_code == 302, response.content
    document = Document.objects.get()
    assert document.name == stored
    assert files_under(tmp_path) == [document.source_path]
    assert document.source_path.is_relative_to(media_root)


# --- malformed JSON and wrong types on every JSON POST endpoint ---------------------------------


MALFORMED = {
    "not json": b"{not json",
    "empty": b"",
    "truncated": b'{"pool": "local", "pods": 1',
    "null": b"null",
    "a list": b"[]",
    "a string": b'"local"',
    "a number": b"1",
    "not utf-8": b'{"pool": "\xff\xfe"}',
    "nested deep": b"[" * 5000 + b"]" * 5000,
    "huge number": b'{"pool": "local", "pods": 1' + b"0" * 400 + b"}",
    "NaN": b'{"pool": "local", "pods": NaN}',
}


@pytest.fixture
def pod(local_pool, queued):
    return Pod.objects.create(pool=local_pool, name="fa-local-battery", state=Pod.State.READY, provider_id="999999")


@pytest.fixture
def post_as_admin(client, admin_token, django_capture_on_commit_callbacks):
    """POST as an admin token and run what the view left for after its commit (enqueued tasks) at once,
    so that a task a bad request should not have enqueued shows up in the queue."""

    def post(url: str, body: bytes | str, content_type: str = "application/json"):
        with django_capture_on_commit_callbacks(execute=True):
            # CONTENT_TYPE also for an empty body, which the test client would otherwise send without one.
            return client.post(url, body, content_type=content_type, headers=auth(admin_token),
                               CONTENT_TYPE=content_type)  # fmt: skip

    return post


def assert_control_plane_untouched(pod: Pod) -> None:
    assert ScaleRequest.objects.count() == 0
    assert get_broker().queue_size() == 0  # the queue was emptied for the test by `queued`
    pod.refresh_from_db()
    assert pod.state == Pod.State.READY


@pytest.mark.parametrize("url", ["/v1/runpod/scale", "/v1/runpod/release"])
@pytest.mark.parametrize("body", list(MALFORMED))
def test_malformed_json_gets_a_400_json_error_and_changes_nothing(post_as_admin, pod, url, body):
    response = post_as_admin(url, MALFORMED[body])

    assert_refused(response, 400)
    assert_control_plane_untouched(pod)


WRONG_TYPES = [
    ("/v1/runpod/scale", {"pool": 5, "pods": 1}, "pool"),
    ("/v1/runpod/scale", {"pool": ["local"], "pods": 1}, "pool"),
    ("/v1/runpod/scale", {"pool": "local", "pods": 1.5}, "pods"),
    ("/v1/runpod/scale", {"pool": "local", "pods": True}, "pods"),
    ("/v1/runpod/scale", {"pool": "local", "pods": None}, "exactly one"),
    ("/v1/runpod/scale", {"pool": "local", "delta": "-1"}, "delta"),
    ("/v1/runpod/scale", {"pool": "local", "pods": 1, "wait_s": "soon"}, "wait_s"),
    ("/v1/runpod/scale", {"pool": "", "pods": 1}, "pool"),
    ("/v1/runpod/release", {"pod_id": True}, "pod_id"),
    ("/v1/runpod/release", {"pod_id": 1.0}, "pod_id"),
    ("/v1/runpod/release", {"pod_id": [1]}, "pod_id"),
    ("/v1/runpod/release", {"pod_id": None}, "pod_id"),
    ("/v1/runpod/release", {}, "pod_id"),
    ("/v1/runpod/release", {"pod_id": 1, "reason": 5}, "reason"),
    ("/v1/runpod/release", {"pod_id": 1, "reason": "x" * 201}, "reason"),
    ("/v1/runpod/release", {"pod_id": 1, "force": True}, "force"),
]


@pytest.mark.parametrize(("url", "body", "names"), WRONG_TYPES)
def test_a_field_of_the_wrong_type_is_named_in_a_400(post_as_admin, pod, url, body, names):
    response = post_as_admin(url, json.dumps(body))

    assert_refused(response, 400, names)
    assert_control_plane_untouched(pod)


@pytest.mark.parametrize(
    ("body", "names"),
    [
        ({"pool": "local", "pods": 10**6}, "pods"),
        ({"pool": "local", "pods": 2**64}, "pods"),
        ({"pool": "local", "delta": 10**6}, "delta"),
        ({"pool": "local", "delta": 9_999}, "at most"),
        ({"pool": "local", "delta": -(2**64)}, "delta"),
        ({"pool": "local", "pods": 0, "wait_s": -1}, "wait_s"),
        ({"pool": "local", "pods": 0, "wait_s": 301}, "wait_s"),
        ({"pool": "local", "pods": 0, "wait_s": 1e308}, "wait_s"),
    ],
)
def test_negative_or_huge_scale_requests_are_refused(post_as_admin, pod, body, names):
    response = post_as_admin("/v1/runpod/scale", json.dumps(body))

    assert_refused(response, 400, names)
    assert_control_plane_untouched(pod)


@pytest.mark.parametrize("pod_id", [0, -1, 2**63, 10**30])
def test_release_of_an_impossible_pod_id_is_a_4xx_not_a_crash(post_as_admin, pod, pod_id):
    response = post_as_admin("/v1/runpod/release", json.dumps({"pod_id": pod_id}))

    assert_refused(response, 400 if pod_id < 1 else 404)
    assert_control_plane_untouched(pod)


@pytest.mark.parametrize("url", ["/v1/runpod/scale", "/v1/runpod/release"])
@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data"])
def test_a_json_endpoint_refuses_another_content_type_with_415(post_as_admin, pod, url, content_type):
    body = "pool=local&pods=1&pod_id=1" if "form" in content_type else '{"pool": "local", "pods": 1}'
    if content_type == "multipart/form-data":
        content_type += "; boundary=x"
    response = post_as_admin(url, body, content_type)

    assert_refused(response, 415, "application/json")
    assert_control_plane_untouched(pod)


# --- bodies over the limits ------------------------------------------------------------------------


@pytest.mark.parametrize("url", ["/v1/runpod/scale", "/v1/runpod/release"])
@pytest.mark.parametrize("size", [20_000, 3 * 1024 * 1024], ids=["over the endpoint's 10 kB", "over Django's 2.5 MB"])
def test_a_json_body_over_the_limit_gets_a_413_json_error(post_as_admin, pod, url, size):
    padding = "x" * size
    body = json.dumps({"pool": "local", "pods": 1, "pod_id": pod.pk, "reason": padding})

    response = post_as_admin(url, body)

    assert_refused(response, 413, "too large")
    assert_control_plane_untouched(pod)


def test_form_fields_over_djangos_memory_limit_on_submission_get_a_413_json_error(
    client, submit_token, media_root, settings
):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    upload = SimpleUploadedFile("a.pdf", pdf_bytes(PAGES_TRUTH[:1]))

    response = client.post("/v1/jobs", {"files": [upload], "languages": "e" * 5000}, headers=auth(submit_token))

    assert_refused(response, 413, "form fields")
    assert_nothing_made(media_root)


@pytest.mark.parametrize("size", [3 * 1024 * 1024, 30 * 1024 * 1024], ids=["3 MB", "30 MB"])
def test_a_json_submission_past_djangos_memory_limit_gets_a_413_json_error(client, submit_token, media_root, size):
    body = json.dumps({"urls": ["https://example.org/a.pdf"], "pool": "x" * size})

    response = client.post("/v1/jobs", body, content_type="application/json", headers=auth(submit_token))

    assert_refused(response, 413, "larger than 1 MB")
    assert_nothing_made(media_root)


def test_a_browser_post_past_djangos_limit_on_an_api_endpoint_gets_a_413_json_error(admin_user, settings):
    """A session's POST is CSRF-checked, which reads the form body: past Django's memory limit
    that raised RequestDataTooBig before any view check, and Django answered its HTML 400."""
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 100
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(admin_user)
    browser.cookies["csrftoken"] = "a" * 32  # with a cookie the check reads the form's token

    response = browser.post("/v1/runpod/scale", {"pool": "local", "pods": "1", "padding": "x" * 500})

    assert_refused(response, 413, "too large")


def test_the_api_error_handlers_answer_json_under_v1_and_html_elsewhere(rf):
    from django.core.exceptions import RequestDataTooBig, SuspiciousOperation

    from fleetadmin.urls import bad_request, permission_denied, server_error

    assert_refused(bad_request(rf.post("/v1/jobs"), RequestDataTooBig("too big")), 413, "too large")
    assert_refused(bad_request(rf.get("/v1/jobs"), SuspiciousOperation("odd")), 400, "odd")
    assert_refused(permission_denied(rf.get("/v1/jobs")), 403, "forbidden")
    assert_refused(server_error(rf.get("/v1/jobs")), 500, "internal error")
    assert bad_request(rf.get("/jobs/"), SuspiciousOperation("odd"))["Content-Type"].startswith("text/html")


@pytest.mark.parametrize(
    "query", ["languages=eng;rm%20-rf", "languages=eng%3Brm%20-rf", "pool=local"], ids=["raw ;", "encoded ;", "pool"]
)
def test_a_submission_field_in_the_query_string_is_refused_not_ignored(client, submit_token, media_root, query):
    upload = SimpleUploadedFile("a.pdf", pdf_bytes(PAGES_TRUTH[:1]))

    response = client.post(f"/v1/jobs?{query}", {"files": [upload]}, headers=auth(submit_token))

    assert_refused(response, 400, "query string")
    assert_nothing_made(media_root)


@pytest.mark.parametrize(
    "fields, words",
    [
        ({"languages": ["eng", "eng;rm -rf"]}, ["languages", "more than once"]),
        ({"language": "eng;rm -rf"}, ["unknown field", "language"]),
        ({"languages": "eng;rm -rf"}, ["languages must look like", "eng;rm -rf"]),
        ({"languages": "eng\n"}, []),
        ({"languages": "eng+deu;"}, ["languages must look like"]),
        ({"languages": ""}, ["languages must look like"]),
    ],
    ids=["twice", "misspelt", "shell", "trailing newline is trimmed", "trailing ;", "empty"],
)
def test_languages_on_a_multipart_submission_are_checked_strictly(client, submit_token, media_root, fields, words):
    upload = SimpleUploadedFile("a.pdf", pdf_bytes(PAGES_TRUTH[:1]))

    response = client.post("/v1/jobs", {"files": [upload], **fields}, headers=auth(submit_token))

    if not words:
        assert response.status_code == 201, response.content
        assert response.json()["languages"] == "eng"
        return
    assert_refused(response, 400, *words)
    assert_nothing_made(media_root)


def test_malformed_languages_on_the_form_are_a_form_error(client, ordinary_user, media_root):
    client.force_login(ordinary_user)
    upload = SimpleUploadedFile("a.pdf", pdf_bytes(PAGES_TRUTH[:1]))

    response = client.post("/jobs/new", {"files": [upload], "pool": "local", "languages": "eng;rm -rf"})

    assert response.status_code == 400
    assert "languages must look like" in html.unescape(response.content.decode())
    assert_no_job_and_the_files_kept(media_root)  # (the form keeps the files chosen, an hour)


def test_malformed_languages_on_the_command_line_exit_2_with_the_message(tmp_path, media_root, capsys):
    from django.core.management import call_command

    document = tmp_path / "a.pdf"
    document.write_bytes(pdf_bytes(PAGES_TRUTH[:1]))

    with pytest.raises(SystemExit) as exited:
        call_command("ocr", str(document), "--languages", "eng;rm -rf", "--out", str(tmp_path / "out"))

    assert exited.value.code == 2
    assert "languages must look like" in capsys.readouterr().err
    assert_nothing_made(media_root)


# --- ids too large for the database, and paths that match no endpoint -----------------------------


HUGE = 2**70


@pytest.mark.parametrize("method", ["get", "post"])
@pytest.mark.parametrize(
    "url",
    [f"/v1/jobs/{HUGE}", f"/v1/jobs/{HUGE}/result.txt", f"/v1/jobs/{HUGE}/result.jsonl", f"/v1/jobs/{HUGE}/cancel",
     f"/v1/jobs/{HUGE}/retry", f"/v1/jobs/{HUGE}/pages", f"/v1/runpod/scale/{HUGE}"],
)  # fmt: skip
def test_an_id_too_large_for_the_database_in_an_api_path_is_a_json_404(client, admin_token, url, method):
    response = getattr(client, method)(url, headers=auth(admin_token))

    if response.status_code == 405:
        return  # the other method is the one that reaches the lookup
    assert_refused(response, 404)


@pytest.mark.parametrize(
    "url", [f"/jobs/{HUGE}", f"/jobs/{HUGE}/progress", f"/jobs/{HUGE}/viewer", f"/jobs/{HUGE}/documents/{HUGE}"]
)
def test_an_id_too_large_for_the_database_in_a_page_path_is_a_404(client, admin_user, url):
    client.force_login(admin_user)

    assert client.get(url).status_code == 404


@pytest.mark.parametrize("url", [f"/jobs/{HUGE}/cancel", f"/jobs/{HUGE}/retry", f"/pods/{HUGE}/release"])
def test_a_button_posting_an_id_too_large_for_the_database_is_a_404(
    client, admin_user, url, queued, django_capture_on_commit_callbacks
):
    client.force_login(admin_user)

    with django_capture_on_commit_callbacks(execute=True):
        assert client.post(url).status_code == 404
    assert queued() == []


@pytest.mark.parametrize("url", ["/v1/jobs/abc", "/v1/jobs/1/result.pdf", "/v1/nothing", "/v1/runpod/scale/-1"])
def test_a_path_under_v1_that_matches_no_endpoint_gets_a_json_404(url, admin_token):
    client = Client(raise_request_exception=False)

    response = client.get(url, headers=auth(admin_token))

    assert_refused(response, 404)
