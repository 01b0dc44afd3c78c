"""The job page's page viewer: pages to check first, batches of 25 as the browser scrolls, boxes
placed from the page's pixel size, a document's bytes streamed (and in ranges) only to whoever
may see the job. The browser's side is in tests/e2e/test_viewer_browser.py."""

from __future__ import annotations

import json
import re

import pytest
from asgiref.sync import async_to_sync
from django.conf import settings
from django.test import AsyncClient

from ocrjobs import storage
from ocrjobs.viewer import VIEWER_BATCH, confidence_band, viewer_batch
from tests.factories import image_bytes, pdf_bytes
from tests.ocrjobs.helpers import complete_all, split, submit, tiff_bytes


def result(confidence: float, *, text: str = "a line", lines: list | None = None, **extra) -> dict:
    return {"text": text, "confidence": confidence, "width": 1700, "height": 2200, "dpi": 200, "engine": "tesseract",
            "lines": lines if lines is not None else [{"text": text, "bbox": [170, 220, 850, 330],
                                                       "confidence": confidence}], **extra}  # fmt: skip


def shown(html: str) -> list[int]:
    """The page numbers of the viewer's pages in the order the HTML shows them."""
    return [int(n) for n in re.findall(r"· page (\d+)", html)]


@pytest.fixture
def report(ordinary_user, local_pool):
    """A three-page PDF read with confidences 95, 42 and 71 (two under the default 80)."""
    job = submit(ordinary_user, {"report.pdf": pdf_bytes()})
    split(job)
    complete_all(job, results={(0, 1): result(95.0, text="Water levels rose"), (0, 2): result(42.0, text="Three pumps"),
                               (0, 3): result(71.0, text="Budget")})  # fmt: skip
    return job


@pytest.fixture
def long_job(ordinary_user, local_pool):
    """A 60-frame TIFF; frames 7, 20, 33, 46 and 59 read at 50, the rest at 99."""
    job = submit(ordinary_user, {"scan.tif": tiff_bytes([(60, 40)] * 60)})
    split(job)
    low = {7, 20, 33, 46, 59}
    complete_all(job, results={(0, n): result(50.0 if n in low else 99.0, text=f"frame {n}") for n in range(1, 61)})
    return job


def test_pages_under_the_threshold_are_listed_first_then_the_rest_in_order(client, ordinary_user, report):
    client.force_login(ordinary_user)

    html = client.get(f"/jobs/{report.pk}").content.decode()

    assert shown(html) == [2, 3, 1]
    assert html.count('<span class="chip to-check">to check</span>') == 2
    assert "All pages (3)" in html and "To check (2)" in html


def test_the_threshold_comes_from_the_setting(client, ordinary_user, report, settings):
    settings.VIEWER_CONFIDENCE_THRESHOLD = 50
    client.force_login(ordinary_user)

    html = client.get(f"/jobs/{report.pk}").content.decode()

    assert shown(html) == [2, 1, 3]
    assert "To check (1)" in html and "under 50 (to check)" in html


def test_the_filter_shows_only_the_pages_to_check(client, ordinary_user, report):
    client.force_login(ordinary_user)

    html = client.get(f"/jobs/{report.pk}?check=1").content.decode()

    assert shown(html) == [2, 3]
    assert '<strong class="viewer-count-to-check">To check (2)</strong>' in html


def test_the_batches_walk_every_page_once_to_check_first(client, ordinary_user, long_job):
    client.force_login(ordinary_user)
    html = client.get(f"/jobs/{long_job.pk}").content.decode()
    batches = [shown(html)]
    while found := re.search(r'hx-get="(/jobs/\d+/viewer\?offset=\d+[^"]*)"', html):
        html = client.get(found.group(1).replace("&amp;", "&")).content.decode()
        batches.append(shown(html))
        assert len(batches) < 10

    low = [7, 20, 33, 46, 59]
    assert [len(batch) for batch in batches] == [VIEWER_BATCH, VIEWER_BATCH, 10]
    assert sum(batches, []) == low + [n for n in range(1, 61) if n not in low]


def test_the_filtered_batches_page_only_the_pages_to_check(ordinary_user, long_job, settings):
    first, next_offset = viewer_batch(long_job, threshold=80, only_to_check=True, limit=2)
    second, last = viewer_batch(long_job, threshold=80, only_to_check=True, offset=next_offset, limit=2)
    third, end = viewer_batch(long_job, threshold=80, only_to_check=True, offset=last, limit=2)

    assert [[item.page.number for item in batch] for batch in (first, second, third)] == [[7, 20], [33, 46], [59]]
    assert (next_offset, last, end) == (2, 4, None)


def test_a_bad_offset_starts_at_the_first_batch(client, ordinary_user, report):
    client.force_login(ordinary_user)

    assert shown(client.get(f"/jobs/{report.pk}/viewer?offset=x").content.decode()) == [2, 3, 1]


def test_each_line_is_boxed_at_its_share_of_the_pages_pixels_and_coloured_by_confidence(
    client, ordinary_user, local_pool
):
    job = submit(ordinary_user, {"report.pdf": pdf_bytes([["one"]])})
    split(job)
    lines = [{"text": "Sharp <b>words</b>", "bbox": [170, 220, 850, 330], "confidence": 96.0},
             {"text": "faint", "bbox": [0, 1100, 1700, 2200], "confidence": 30.0},
             {"text": "no box", "bbox": None, "confidence": 85.0}]  # fmt: skip
    complete_all(job, results={(0, 1): result(70.0, lines=lines)})
    client.force_login(ordinary_user)

    html = client.get(f"/jobs/{job.pk}").content.decode()

    assert 'data-aspect="1700 / 2200"' in html
    data = re.search(r'<script id="viewer-lines-\d+" type="application/json">(.*?)</script>', html).group(1)
    assert json.loads(data) == [
        {"n": 0, "text": "Sharp <b>words</b>", "conf": 96.0, "band": "good", "box": [10.0, 10.0, 40.0, 5.0]},
        {"n": 1, "text": "faint", "conf": 30.0, "band": "low", "box": [0.0, 50.0, 100.0, 50.0], "check": True},
        {"n": 2, "text": "no box", "conf": 85.0, "band": "fair", "box": None},
    ]
    assert "<b>" not in data  # a page's text is never markup: json_script escapes it
    assert f'data-pdf="/jobs/{job.pk}/documents/{job.documents.get().pk}"' in html


def test_the_bands_are_under_the_threshold_halfway_to_100_and_above():
    assert [confidence_band(c, 80) for c in (None, 0, 79.9, 80, 89.9, 90, 100)] == [
        "unknown", "low", "low", "fair", "fair", "good", "good",
    ]  # fmt: skip


@pytest.mark.parametrize("engine", ["vlm", "scribe"])  # the answer says Markdown: the name is not asked
def test_a_markdown_pages_text_is_left_for_the_browser_to_render_and_escaped(client, ordinary_user, local_pool,
                                                                              engine):  # fmt: skip
    job = submit(ordinary_user, {"note.png": image_bytes(["a table"])})
    split(job)
    markdown = "# Results\n\n<table><tr><td>4</td></tr></table>\n<script>alert(1)</script>"
    complete_all(job, results={(0, 1): result(88.0, text=markdown, engine=engine, markdown=True, dpi=None,
                                         lines=[{"text": markdown, "bbox": None, "confidence": 88.0}])})  # fmt: skip
    client.force_login(ordinary_user)

    html = client.get(f"/jobs/{job.pk}").content.decode()

    assert '<div class="markdown" data-markdown># Results' in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html and "<script>alert(1)" not in html
    assert "viewer-lines-" not in html  # no boxes, no line list: the Markdown is the text
    assert f'<img src="/jobs/{job.pk}/documents/{job.documents.get().pk}"' in html


def test_only_who_may_see_the_job_sees_its_viewer_and_its_documents(client, ordinary_user, outsider, admin_user,
                                                                    report):  # fmt: skip
    document = report.documents.get()
    urls = [f"/jobs/{report.pk}", f"/jobs/{report.pk}/viewer", f"/jobs/{report.pk}/documents/{document.pk}"]

    anonymous = [client.get(url) for url in urls]
    client.force_login(outsider)
    refused = [client.get(url).status_code for url in urls]
    client.force_login(ordinary_user)
    owner = [client.get(url).status_code for url in urls]
    client.force_login(admin_user)
    staff = [client.get(url).status_code for url in urls]

    assert all(r.status_code == 302 and r["Location"].startswith("/login/") for r in anonymous)
    assert refused == [404, 404, 404]
    assert owner == [200, 200, 200]
    assert staff == [200, 200, 200]


def test_a_document_of_another_job_is_not_found_through_this_one(client, ordinary_user, local_pool, report):
    other = submit(ordinary_user, {"other.pdf": pdf_bytes()})
    client.force_login(ordinary_user)

    assert client.get(f"/jobs/{report.pk}/documents/{other.documents.get().pk}").status_code == 404
    assert client.get(f"/jobs/{report.pk}/documents/{2**64}").status_code == 404  # past any database's ids


def test_a_document_streams_as_stored_sandboxed(client, ordinary_user, report):
    document = report.documents.get()
    stored = storage.documents().open(document.source, "rb").read()
    client.force_login(ordinary_user)

    response = client.get(f"/jobs/{report.pk}/documents/{document.pk}")

    assert response.streaming
    body = b"".join(response.streaming_content)
    assert body == stored and int(response["Content-Length"]) == len(stored)
    assert response["Content-Type"] == "application/pdf"
    assert response["Accept-Ranges"] == "bytes"
    assert response["Content-Security-Policy"].startswith("sandbox")
    assert response["X-Content-Type-Options"] == "nosniff"


def test_a_document_answers_a_range_with_those_bytes_only(client, ordinary_user, report):
    document = report.documents.get()
    stored = storage.documents().open(document.source, "rb").read()
    url = f"/jobs/{report.pk}/documents/{document.pk}"
    client.force_login(ordinary_user)

    middle = client.get(url, headers={"Range": "bytes=100-1123"})
    tail = client.get(url, headers={"Range": "bytes=-50"})
    past = client.get(url, headers={"Range": f"bytes={len(stored)}-"})

    assert middle.status_code == 206
    assert b"".join(middle.streaming_content) == stored[100:1124]
    assert middle["Content-Range"] == f"bytes 100-1123/{len(stored)}"
    assert b"".join(tail.streaming_content) == stored[-50:]
    assert past.status_code == 416 and past["Content-Range"] == f"bytes */{len(stored)}"


def test_a_range_with_a_number_too_long_to_read_is_ignored_not_a_500(client, ordinary_user, report):
    document = report.documents.get()
    client.force_login(ordinary_user)

    response = client.get(f"/jobs/{report.pk}/documents/{document.pk}", headers={"Range": f"bytes={'9' * 4400}-"})

    assert response.status_code == 200  # review N8: int() of over 4,300 digits raised, a 500


def test_under_asgi_a_document_is_sent_a_chunk_at_a_time(client, ordinary_user, report, monkeypatch):
    # Django reads a synchronous iterator whole into memory under ASGI; a document must not be one.
    monkeypatch.setattr(storage, "CHUNK", 10_000)
    document = report.documents.get()
    stored = storage.documents().open(document.source, "rb").read()
    client.force_login(ordinary_user)
    session = client.cookies[settings.SESSION_COOKIE_NAME].value

    async def download():
        asgi = AsyncClient()
        asgi.cookies[settings.SESSION_COOKIE_NAME] = session
        response = await asgi.get(f"/jobs/{report.pk}/documents/{document.pk}")
        return response.is_async, [chunk async for chunk in response.streaming_content]

    is_async, chunks = async_to_sync(download)()

    assert is_async
    assert b"".join(chunks) == stored
    assert max(len(chunk) for chunk in chunks) == 10_000 and len(chunks) == -(-len(stored) // 10_000)


def test_a_document_is_read_a_chunk_at_a_time(ordinary_user, report, monkeypatch):
    monkeypatch.setattr(storage, "CHUNK", 1000)
    document = report.documents.get()
    size = storage.document_size(document.source)

    chunks = list(storage.document_chunks(document.source, 10, 2510))

    assert [len(chunk) for chunk in chunks] == [1000, 1000, 500]
    assert len(b"".join(storage.document_chunks(document.source))) == size


def test_a_tiff_is_not_served_to_the_browser_which_cannot_show_it(client, ordinary_user, long_job):
    client.force_login(ordinary_user)

    html = client.get(f"/jobs/{long_job.pk}").content.decode()

    assert client.get(f"/jobs/{long_job.pk}/documents/{long_job.documents.get().pk}").status_code == 404
    assert "viewer-sheet" not in html and "frame 7" in html


@pytest.fixture
def fine_pages_with_faint_lines(ordinary_user, local_pool):
    """Three pages read at 90 or more overall; page 2 holds two lines under 80, page 3 one."""
    job = submit(ordinary_user, {"report.pdf": pdf_bytes()})
    split(job)

    def lines(*confidences):
        return [{"text": f"line at {c}", "bbox": [100, 100 + 80 * i, 900, 160 + 80 * i], "confidence": c}
                for i, c in enumerate(confidences)]  # fmt: skip

    complete_all(job, results={(0, 1): result(97.0, lines=lines(97, 96)), (0, 2): result(90.0, lines=lines(99, 62, 71, 99)),
                               (0, 3): result(91.0, lines=lines(95, 79.5))})  # fmt: skip
    return job


def test_a_page_whose_lines_are_under_the_threshold_is_to_check_though_its_own_confidence_is_not(
    client, ordinary_user, fine_pages_with_faint_lines
):
    job = fine_pages_with_faint_lines
    client.force_login(ordinary_user)

    html = client.get(f"/jobs/{job.pk}").content.decode()
    lines = client.get(f"/jobs/{job.pk}/viewer/lines").content.decode()
    only = client.get(f"/jobs/{job.pk}?check=1").content.decode()

    assert "To check (2)" in html and shown(html) == [2, 3, 1]
    assert "2 lines under 80" in html and "1 line under 80" in html  # each page's own count
    assert f'hx-get="/jobs/{job.pk}/viewer/lines"' in html
    assert ">3 lines under 80<" in lines
    assert shown(only) == [2, 3]


def test_a_corrected_line_is_no_longer_to_check(client, ordinary_user, fine_pages_with_faint_lines):
    job = fine_pages_with_faint_lines
    client.force_login(ordinary_user)
    third = job.pages.get(number=3)

    assert client.post(f"/jobs/{job.pk}/pages/{third.pk}/lines/1", {"text": "line at 80"}).status_code == 200

    html = client.get(f"/jobs/{job.pk}").content.decode()
    assert "To check (1)" in html and shown(html) == [2, 1, 3]
    assert ">2 lines under 80<" in client.get(f"/jobs/{job.pk}/viewer/lines").content.decode()
    data = re.search(rf'<script id="viewer-lines-{third.pk}" type="application/json">(.*?)</script>', html).group(1)
    assert json.loads(data)[1] == {"n": 1, "text": "line at 80", "conf": 79.5, "band": "low",
                                   "box": json.loads(data)[1]["box"], "engine": "line at 79.5"}  # fmt: skip


def test_the_lines_count_is_only_for_who_may_see_the_job(client, outsider, fine_pages_with_faint_lines):
    client.force_login(outsider)

    assert client.get(f"/jobs/{fine_pages_with_faint_lines.pk}/viewer/lines").status_code == 404


def test_pages_read_before_get_their_lines_lowest_confidence_from_the_migration(fine_pages_with_faint_lines):
    from importlib import import_module

    from django.apps import apps

    migration = import_module("ocrjobs.migrations.0028_line_corrections")
    job = fine_pages_with_faint_lines
    job.pages.update(min_line_confidence=None)

    migration.lowest_line_confidences(apps, None)

    assert dict(job.pages.values_list("number", "min_line_confidence")) == {1: 96.0, 2: 62.0, 3: 79.5}
