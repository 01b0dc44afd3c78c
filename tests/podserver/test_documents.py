"""The document cache and pages rendered on the pod (issue 12): PUT a document once, ask for its pages."""

from __future__ import annotations

import hashlib
import io
import socket
import threading
import time
from pathlib import Path

import httpx
import pytest
from PIL import Image

from podserver.documents import CacheFull, CacheInUse, DocumentCache, DocumentError
from podserver.pages import BadImage, count_pages
from tests.factories import (
    PAGES_TRUTH,
    accuracy,
    corrupt_pdf_bytes,
    encrypted_pdf_bytes,
    image_bytes,
    pdf_bytes,
    render_page,
    zero_page_pdf_bytes,
)

from .conftest import HANG_GUARD

# The pod server touches no database: once, on the SQLite run.
pytestmark = pytest.mark.once_sqlite


def on_disk(directory: Path) -> list[str]:
    return sorted(path.name for path in directory.iterdir() if path.name != ".lock")


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def put(url: str, data: bytes, name: str | None = None) -> httpx.Response:
    return httpx.put(f"{url}/v1/documents/{name or sha(data)}", content=data, timeout=HANG_GUARD)


def ocr(url: str, **request: object) -> httpx.Response:
    return httpx.post(f"{url}/v1/ocr", json=request, timeout=HANG_GUARD)


def one_page_pdf(text: str) -> bytes:
    return pdf_bytes([[text]])


def tiff_pages(pages: list[list[str]]) -> bytes:
    images = [render_page(lines, width=1400, height=600) for lines in pages]
    out = io.BytesIO()
    images[0].save(out, format="TIFF", save_all=True, append_images=images[1:], compression="tiff_lzw")
    return out.getvalue()


# The cache on its own.


@pytest.fixture
def cache_dir(tmp_path: Path) -> Path:
    return tmp_path / "documents"  # tmp_path itself holds the project's media/ (an autouse fixture)


def store(cache: DocumentCache, data: bytes) -> str:
    cache.put(sha(data), len(data), io.BytesIO(data), lambda path: 1)
    return sha(data)


def test_least_recently_used_document_goes_first(cache_dir: Path) -> None:
    cache = DocumentCache(cache_dir, capacity_bytes=300)
    a, b = store(cache, b"a" * 100), store(cache, b"b" * 100)
    store(cache, b"c" * 100)
    cache.touch(a)  # a is used again: b is now the oldest

    d = store(cache, b"d" * 100)

    assert cache.get(b) is None and not (cache_dir / b).exists()
    assert all(cache.get(name) for name in (a, d))
    assert cache.stats() == {"count": 3, "bytes": 300, "capacity_bytes": 300}


def test_a_document_in_use_is_not_evicted_under_its_page(cache_dir: Path) -> None:
    cache = DocumentCache(cache_dir, capacity_bytes=100)
    a = store(cache, b"a" * 100)
    with cache.use(a) as held:
        assert held is not None
        b = store(cache, b"b" * 100)  # no room but a's, and a page holds a
        assert (cache_dir / a).read_bytes() == b"a" * 100
        assert cache.stats()["bytes"] == 200  # over capacity while pinned
    assert cache.get(a) is None  # evicted once its page let go
    assert cache.get(b) is not None
    assert cache.stats()["bytes"] == 100


def test_a_body_whose_hash_differs_leaves_nothing(cache_dir: Path) -> None:
    cache = DocumentCache(cache_dir, capacity_bytes=1000)
    with pytest.raises(DocumentError, match="sha256"):
        cache.put(sha(b"expected"), 8, io.BytesIO(b"received"), lambda path: 1)
    assert on_disk(cache_dir) == []
    assert cache.stats()["count"] == 0


def test_a_short_body_or_a_non_document_leaves_nothing(cache_dir: Path) -> None:
    cache = DocumentCache(cache_dir, capacity_bytes=1000)
    with pytest.raises(DocumentError, match="incomplete body"):
        cache.put(sha(b"x" * 10), 10, io.BytesIO(b"x" * 4), lambda path: 1)

    def refuse(path: Path) -> int:
        raise BadImage("not a PDF or an image")

    with pytest.raises(BadImage):
        cache.put(sha(b"y"), 1, io.BytesIO(b"y"), refuse)
    assert on_disk(cache_dir) == []


def test_a_document_larger_than_the_cache_is_refused(cache_dir: Path) -> None:
    cache = DocumentCache(cache_dir, capacity_bytes=10)
    with pytest.raises(CacheFull):
        cache.put(sha(b"z" * 11), 11, io.BytesIO(b"z" * 11), lambda path: 1)


def test_a_restarted_pod_keeps_its_documents_and_sweeps_cut_writes(cache_dir: Path) -> None:
    first = DocumentCache(cache_dir, capacity_bytes=1000)
    kept = store(first, b"kept")
    (cache_dir / ".abc-123.part").write_bytes(b"half a document")
    first.close()

    again = DocumentCache(cache_dir, capacity_bytes=1000)

    assert again.get(kept) is not None
    assert on_disk(cache_dir) == [kept]


def test_two_pod_servers_cannot_share_a_cache_directory(cache_dir: Path) -> None:
    first = DocumentCache(cache_dir, capacity_bytes=1000)
    with pytest.raises(CacheInUse, match="another running pod server"):
        DocumentCache(cache_dir, capacity_bytes=1000)
    first.close()
    DocumentCache(cache_dir, capacity_bytes=1000).close()  # free again once the first let go


def test_page_counts_of_each_kind(tmp_path: Path) -> None:
    cases = {
        "pdf": (pdf_bytes(), 3),
        "png": (image_bytes(["one"]), 1),
        "jpeg": (image_bytes(["one"], "JPEG"), 1),
        "tiff": (tiff_pages([["one"], ["two"]]), 2),
    }
    for name, (data, expected) in cases.items():
        (tmp_path / name).write_bytes(data)
        assert count_pages(tmp_path / name) == expected, name
    for name, data in {
        "encrypted": encrypted_pdf_bytes(),
        "zero": zero_page_pdf_bytes(),
        "corrupt": corrupt_pdf_bytes(),
        "text": b"hello",
    }.items():
        (tmp_path / name).write_bytes(data)
        with pytest.raises(BadImage):
            count_pages(tmp_path / name)


# Over HTTP, against a real engine.


def test_put_stores_once_and_answers_what_it_counted(start_server) -> None:
    _, url = start_server()
    data = pdf_bytes()

    first, second = put(url, data), put(url, data)

    assert first.status_code == 201, first.text
    assert first.json() == {"sha256": sha(data), "bytes": len(data), "pages": 3}
    assert second.status_code == 200  # idempotent
    assert second.json() == first.json()
    documents = httpx.get(f"{url}/v1/models").json()["documents"]
    assert (documents["count"], documents["bytes"]) == (1, len(data))


def test_pod_renders_the_page_asked_for(start_server) -> None:
    _, url = start_server()
    data = pdf_bytes()
    assert put(url, data).status_code == 201

    response = ocr(url, document=sha(data), page=2, dpi=200, languages="eng")

    assert response.status_code == 200, response.text
    body = response.json()
    assert accuracy(body["text"], " ".join(PAGES_TRUTH[1])) >= 0.98, body["text"]
    assert (body["width"], body["height"], body["dpi"]) == (1700, 2200, 200)  # A 200 DPI render of a 200 DPI scan
    assert isinstance(body["render_seconds"], float)
    assert len(body["lines"]) == 3


def test_dpi_sets_the_render_size(start_server) -> None:
    _, url = start_server()
    data = one_page_pdf("Rendered at half the resolution.")
    put(url, data)
    body = ocr(url, document=sha(data), page=1, dpi=100).json()
    assert (body["width"], body["height"], body["dpi"]) == (850, 1100, 100)


def test_images_are_read_as_they_are_and_tiff_frames_are_pages(start_server) -> None:
    _, url = start_server()
    tiff = tiff_pages([["The first frame of the scan."], ["The second frame of the scan."]])
    jpeg = image_bytes(["A photographed receipt of 12 euros."], "JPEG")
    put(url, tiff), put(url, jpeg)

    second = ocr(url, document=sha(tiff), page=2)
    receipt = ocr(url, document=sha(jpeg), page=1, dpi=72)  # dpi means nothing to an image

    assert accuracy(second.json()["text"], "The second frame of the scan.") >= 0.95, second.text
    assert accuracy(receipt.json()["text"], "A photographed receipt of 12 euros.") >= 0.95, receipt.text
    assert receipt.json()["width"] == Image.open(io.BytesIO(jpeg)).width
    assert "dpi" not in receipt.json()


def test_a_page_of_an_uncached_document_is_409_and_costs_no_page(start_server) -> None:
    _, url = start_server()
    missing = sha(b"never sent")

    response = ocr(url, document=missing, page=1)

    assert response.status_code == 409
    assert response.json() == {"error": "document not cached", "document": missing}
    models = httpx.get(f"{url}/v1/models").json()
    assert (models["pages_done"], models["pages_failed"]) == (0, 0)


@pytest.mark.parametrize(
    ("request_body", "fragment"),
    [
        ({"page": 4}, "out of range"),
        ({"page": 0}, "page must be"),
        ({"page": True}, "page must be"),
        ({"page": 1, "dpi": 35}, "dpi must be"),
        ({"page": 1, "dpi": 601}, "dpi must be"),
        ({"page": 1, "languages": "xyz"}, "unknown language"),
        ({"page": 1, "document": "ABC"}, "sha256"),
    ],
)
def test_bad_page_requests_are_400(start_server, request_body: dict, fragment: str) -> None:
    _, url = start_server()
    data = pdf_bytes()
    put(url, data)
    response = ocr(url, **{"document": sha(data), **request_body})
    assert response.status_code == 400
    assert fragment in response.json()["error"]


def test_a_body_that_is_not_json_is_400(start_server) -> None:
    _, url = start_server()
    response = httpx.post(f"{url}/v1/ocr", content=b"{nope", headers={"Content-Type": "application/json"})
    assert response.status_code == 400
    assert "not JSON" in response.json()["error"]


@pytest.mark.parametrize(
    ("name", "data", "fragment"),
    [
        ("f" * 63, b"x", "64 lowercase hex"),
        ("F" * 64, b"x", "64 lowercase hex"),
        (sha(b"other"), b"this", "sha256"),
        (None, b"plain text, no document", "not a PDF or an image"),
        (None, encrypted_pdf_bytes(), "not a readable PDF"),
        (None, zero_page_pdf_bytes(), "PDF"),  # pdfium fails to load it, with a varying reason
    ],
    ids=["short-name", "upper-case", "hash-mismatch", "not-a-document", "encrypted", "no-pages"],
)
def test_a_bad_document_is_400_and_not_kept(start_server, name: str | None, data: bytes, fragment: str) -> None:
    server, url = start_server()
    response = put(url, data, name)
    assert response.status_code == 400
    assert fragment in response.json()["error"]
    assert on_disk(server.documents.directory) == []
    # The connection was left in order: the body was read whole, so the next request works.
    assert ocr(url, document=sha(data), page=1).status_code == 409


def test_a_document_over_the_limit_is_413_before_its_body_is_read(start_server) -> None:
    server, url = start_server(max_document_bytes=1000)
    host, port = url.removeprefix("http://").split(":")
    name = "a" * 64
    with socket.create_connection((host, int(port)), timeout=HANG_GUARD) as sock:
        sock.sendall(
            f"PUT /v1/documents/{name} HTTP/1.1\r\nHost: x\r\nContent-Length: 5000000\r\n"
            "Expect: 100-continue\r\n\r\n".encode()
        )
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
    assert reply.startswith(b"HTTP/1.1 413 ")
    assert b"100 Continue" not in reply
    assert server.documents.get(name) is None


def test_eviction_under_the_cap_makes_the_pod_ask_again(start_server) -> None:
    first, second = one_page_pdf("first"), one_page_pdf("second")
    _, url = start_server(cache_bytes=len(first) + len(second) - 1)  # room for one of them
    put(url, first), put(url, second)

    assert ocr(url, document=sha(first), page=1).status_code == 409
    assert put(url, first).status_code == 201
    assert ocr(url, document=sha(first), page=1).status_code == 200


def test_concurrent_uploads_of_one_document_keep_one_copy(start_server) -> None:
    server, url = start_server()
    data = pdf_bytes()
    answers: list[int] = []
    threads = [threading.Thread(target=lambda: answers.append(put(url, data).status_code)) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(HANG_GUARD)
    assert sorted(answers)[-1] == 201 and set(answers) <= {200, 201}
    assert answers.count(201) == 1
    assert on_disk(server.documents.directory) == [sha(data)]


def test_a_restarted_pod_serves_the_documents_it_kept(start_server, tmp_path: Path) -> None:
    data = pdf_bytes()
    kept = tmp_path / "kept-documents"
    before = DocumentCache(kept, capacity_bytes=10**9)
    before.put(sha(data), len(data), io.BytesIO(data), count_pages)
    before.close()

    _, url = start_server(cache_dir=str(kept))

    again = put(url, data)
    assert again.status_code == 200
    assert again.json()["pages"] == 3  # counted again from the file it found
    assert ocr(url, document=sha(data), page=3).status_code == 200


# A crafted page (review M5): its render is bounded by the page's time limit.


def slow_pdf(strokes: int = 200_000) -> bytes:
    """A one-page PDF of a few kB whose page takes pdfium many seconds to render: thousands of
    thick full-page strokes (50,000 took 12 s at 200 DPI on a 2-core test machine)."""
    import pikepdf

    pdf = pikepdf.new()
    content = pikepdf.Stream(pdf, b"10 w " + b"0 0 m 612 792 l S " * strokes)
    pdf.pages.append(pikepdf.Page(pikepdf.Dictionary(Type=pikepdf.Name.Page, MediaBox=[0, 0, 612, 792],
                                                     Contents=content)))  # fmt: skip
    out = io.BytesIO()
    pdf.save(out, compress_streams=True)
    return out.getvalue()


def test_a_page_that_renders_past_its_time_limit_fails_alone_and_the_pod_goes_on(start_server):
    server, url = start_server(lanes=2, page_timeout=5.0)
    crafted, plain = slow_pdf(), one_page_pdf("the other lane reads this")
    assert len(crafted) < 10_000
    for data in (crafted, plain):
        assert put(url, data).status_code == 201
    slow: list[httpx.Response] = []
    thread = threading.Thread(target=lambda: slow.append(ocr(url, document=sha(crafted), page=1, dpi=200)))
    thread.start()
    time.sleep(0.5)  # (the crafted page is rendering now; the other lane is free)

    meanwhile = ocr(url, document=sha(plain), page=1, dpi=200)
    thread.join(HANG_GUARD)

    assert meanwhile.status_code == 200 and accuracy("the other lane reads this", meanwhile.json()["text"]) > 0.9
    [answer] = slow
    assert answer.status_code == 504, answer.text
    assert "did not render within 5 s" in answer.json()["error"]
    again = ocr(url, document=sha(plain), page=1, dpi=200)  # a fresh renderer in place of the killed one
    assert again.status_code == 200
