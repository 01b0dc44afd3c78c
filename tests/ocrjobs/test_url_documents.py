"""Documents by URL (fetched by a worker, never the front) and PDF pages that keep their text layer."""

from __future__ import annotations

import http.server
import json
import socket
import ssl
import subprocess
import threading
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from ocrjobs.models import Document, Job, Page
from ocrjobs.services import fetch, remote
from ocrjobs.services.fetch import document_fetch
from ocrjobs.services.recover import documents_recover
from ocrjobs.services.split import document_split, documents_split
from ocrjobs.services.submission import Upload, job_submit
from tests import hostile
from tests.factories import pdf_bytes

URL = "/v1/jobs"


def _post_json(client, token, body):
    return client.post(URL, json.dumps(body), content_type="application/json",
                       headers={"Authorization": f"Bearer {token}"})  # fmt: skip


@pytest.mark.parametrize(
    "url",
    [
        "ftp://example.org/a.pdf",
        "file:///etc/passwd",
        "http://127.0.0.1/a.pdf",
        "http://10.1.2.3/a.pdf",
        "http://[::1]/a.pdf",
        "http://localhost:8000/a.pdf",
        "http://printer.local/a.pdf",
        "http://169.254.169.254/latest/meta-data",
        "https:///nohost",
    ],
)
def test_the_front_refuses_urls_it_must_never_fetch(client, submit_token, local_pool, url):
    response = _post_json(client, submit_token, {"urls": [url], "pool": "local"})
    assert response.status_code == 400, response.content
    assert list(response.json()) == ["error"]
    assert not Job.objects.exists() and not Document.objects.exists()


def test_a_url_is_stored_unfetched_and_handed_to_a_worker(
    client, submit_token, local_pool, django_capture_on_commit_callbacks, queued
):
    with django_capture_on_commit_callbacks(execute=True):
        response = _post_json(client, submit_token, {"urls": ["https://example.org/reports/q3%20report.pdf"]})
    assert response.status_code == 201
    document = Document.objects.get()
    assert (document.kind, document.url, document.name) == ("url", "https://example.org/reports/q3%20report.pdf",
                                                            "q3 report.pdf")  # fmt: skip
    assert queued() == ["ocrjobs.tasks.fetch_document"]


class _Files(http.server.BaseHTTPRequestHandler):
    routes: dict[str, tuple[int, dict, bytes]] = {}

    def do_GET(self):
        status, headers, body = self.routes.get(self.path, (404, {}, b"no"))
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def file_server():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Files)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", _Files.routes
    server.shutdown()
    _Files.routes.clear()


def _url_job(local_pool, url) -> Document:
    job = Job.objects.create(pool=local_pool)
    return Document.objects.create(job=job, position=0, name="x", kind="url", url=url, size_bytes=0, page_count=0)


def test_a_worker_fetches_checks_and_splits_a_url_document(file_server, local_pool, settings):
    settings.URL_FETCH_ALLOW_PRIVATE = True  # the test's server is on loopback
    base, routes = file_server
    routes["/old"] = (302, {"Location": "/report.pdf"}, b"")
    routes["/report.pdf"] = (200, {"Content-Type": "application/pdf"}, pdf_bytes())
    document = document_fetch(document_id=_url_job(local_pool, f"{base}/old").pk)
    assert (document.kind, document.page_count, document.status) == ("pdf", 3, "split")
    assert document.source_path.read_bytes().startswith(b"%PDF-")
    assert Page.objects.filter(document=document).count() == 3


@pytest.mark.parametrize(
    ("route", "words"),
    [
        ((200, {}, b"hello, not a pdf"), "not a pdf"),
        ((404, {}, b""), "http 404"),
        ((200, {}, b"%PDF-1.7 broken"), "corrupt"),
    ],
)
def test_a_bad_download_fails_its_document_not_the_worker(file_server, local_pool, settings, route, words):
    settings.URL_FETCH_ALLOW_PRIVATE = True
    base, routes = file_server
    routes["/doc"] = route
    document = document_fetch(document_id=_url_job(local_pool, f"{base}/doc").pk)
    assert document.status == "failed" and words in document.error.lower()
    assert Job.objects.get().status == Job.Status.FAILED


def test_a_download_over_the_size_limit_is_refused(file_server, local_pool, settings):
    settings.URL_FETCH_ALLOW_PRIVATE = True
    settings.OCR_MAX_FILE_BYTES = 1000
    base, routes = file_server
    routes["/big.pdf"] = (200, {}, pdf_bytes())
    document = document_fetch(document_id=_url_job(local_pool, f"{base}/big.pdf").pk)
    assert document.status == "failed" and "limit" in document.error


def test_a_name_that_resolves_to_a_private_address_is_refused_before_connecting(local_pool, monkeypatch):
    def resolve(hostile_peer, port, *args, **kwargs):
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("10.0.0.7", port or 80))]

    monkeypatch.setattr(socket, "getaddrinfo", resolve)
    document = document_fetch(document_id=_url_job(local_pool, "http://files.example.org/a.pdf").pk)
    assert document.status == "failed" and "private or loopback" in document.error


def test_the_download_goes_to_the_address_that_was_checked_not_a_second_answer(file_server, local_pool, monkeypatch,
                                                                              settings):  # fmt: skip
    # DNS rebinding: the name answers a permitted address when checked, a forbidden one after.
    base, routes = file_server
    port = int(base.rsplit(":", 1)[1])
    routes["/report.pdf"] = (200, {}, pdf_bytes())
    seen_hosts = []
    monkeypatch.setattr(_Files, "do_GET", _recording_host(_Files.do_GET, seen_hosts))
    answers = iter(["127.0.0.1"])  # the test's server; every later lookup answers 127.0.0.2

    real_getaddrinfo = socket.getaddrinfo

    def resolve(hostile_peer, port, *args, **kwargs):
        if hostile_peer != "files.example.org":  # an address: what connecting to it looks up
            return real_getaddrinfo(hostile_peer, port, *args, **kwargs)
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (next(answers, "127.0.0.2"), port or 80))]

    monkeypatch.setattr(socket, "getaddrinfo", resolve)
    monkeypatch.setattr(remote, "address_allowed", lambda address: address == "127.0.0.1")

    document = document_fetch(document_id=_url_job(local_pool, f"http://files.example.org:{port}/report.pdf").pk)

    assert (document.status, document.page_count) == ("split", 3), document.error
    assert seen_hosts == [f"files.example.org:{port}"]  # the server was asked for the name, at the checked address


@pytest.fixture
def tls_file_server(file_server, tmp_path, monkeypatch):
    """The file server behind TLS, its certificate for files.example.org only, trusted by the fetch."""
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-keyout", str(key),
                    "-out", str(cert), "-subj", "/CN=files.example.org",
                    "-addext", "subjectAltName=DNS:files.example.org"], check=True, capture_output=True)  # fmt: skip
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Files)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    yield server.server_address[1], file_server[1]
    server.shutdown()


def test_an_https_download_pinned_to_its_address_checks_the_certificate_against_the_name(tls_file_server,
                                                                                       local_pool, monkeypatch):  # fmt: skip
    port, routes = tls_file_server
    routes["/report.pdf"] = (200, {}, pdf_bytes())
    real_getaddrinfo = socket.getaddrinfo

    def resolve(hostile_peer, port, *args, **kwargs):
        if hostile_peer != "files.example.org":
            return real_getaddrinfo(hostile_peer, port, *args, **kwargs)
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port or 443))]

    monkeypatch.setattr(socket, "getaddrinfo", resolve)
    monkeypatch.setattr(remote, "address_allowed", lambda address: address == "127.0.0.1")

    # the certificate names files.example.org, not 127.0.0.1: the handshake is for the name
    document = document_fetch(document_id=_url_job(local_pool, f"https://files.example.org:{port}/report.pdf").pk)

    assert (document.status, document.page_count) == ("split", 3), document.error


def _recording_host(do_get, seen: list[str]):
    def recording(handler):
        seen.append(handler.headers["Host"])
        do_get(handler)

    return recording


def _pdf_with_text(lines: list[str]) -> bytes:
    """A one-page PDF with a real text layer (Helvetica), built by hand."""
    content = "BT /F1 18 Tf 72 720 Td " + " ".join(f"({line}) Tj 0 -24 Td" for line in lines) + " ET"
    objects = [
        "<< /Type /Catalog /Pages 2 0 R >>",
        "<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        "<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R /Resources << /Font << /F1 5 0 R >> >> >>",
        f"<< /Length {len(content)} >>\nstream\n{content}\nendstream",
        "<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
    ]
    out, offsets = b"%PDF-1.4\n", []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += f"{number} 0 obj\n{body}\nendobj\n".encode()
    xref = len(out)
    out += f"xref\n0 {len(objects) + 1}\n0000000000 65535 f \n".encode()
    out += b"".join(f"{offset:010d} 00000 n \n".encode() for offset in offsets)
    out += f"trailer\n<< /Size {len(objects) + 1} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n".encode()
    return out


def _split_together(*, document_id: int) -> None:
    documents_split(document_ids=[document_id])


@pytest.mark.parametrize("splitter", [document_split, _split_together])
@pytest.mark.parametrize("skip", [True, False])
def test_pdf_pages_with_a_text_layer_keep_it_when_asked(local_pool, skip, splitter):
    from django.core.files.base import ContentFile

    text = ["This page already carries its own text layer.", "No OCR is needed for it."]
    upload = Upload(name="born-digital.pdf", file=ContentFile(_pdf_with_text(text)))
    job = job_submit(owner=None, uploads=[upload], pool_key="local", skip_text_pages=skip)
    # Split alone or with others, a job whose pages all kept their text layers has ended.
    splitter(document_id=job.documents.get().pk)
    page = Page.objects.get(job=job)
    if skip:
        assert page.status == Page.Status.DONE and page.pod is None
        assert "already carries its own text layer" in page.read_result()["text"]
        job.refresh_from_db()
        assert job.status == Job.Status.DONE
    else:
        assert page.status == Page.Status.PENDING and page.result == ""


# The trust boundary (review H2): a URL hostile_peer we do not control never holds a worker past the
# fetch's total deadline, never has a compressed body decoded, and a fetch writes only under its lease.


def _fetch_in_a_thread(document_id: int) -> tuple[threading.Thread, list]:
    outcome: list = []

    def run() -> None:
        try:
            outcome.append(document_fetch(document_id=document_id))
        finally:
            connection.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


@pytest.mark.parametrize("behave", [hostile.trickled_headers, hostile.trickled_body])
def test_a_host_that_trickles_fails_its_document_at_the_deadline(
    hostile_peer, local_pool, settings, behave, transactional_db
):
    settings.URL_FETCH_TIMEOUT_SECONDS = 1.5
    server = hostile_peer(behave)

    thread, outcome = _fetch_in_a_thread(_url_job(local_pool, server.url("/x.pdf")).pk)
    thread.join(60)

    assert not thread.is_alive(), "the fetch outlived its deadline"
    [document] = outcome
    assert document.status == "failed" and "within 1.5 s" in document.error
    assert Job.objects.get().status == Job.Status.FAILED


@pytest.mark.parametrize("encoding", ["gzip", "br"])
def test_a_compressed_bomb_fails_its_document_undecoded(hostile_peer, local_pool, encoding):
    server = hostile_peer(hostile.bomb(encoding))

    document = document_fetch(document_id=_url_job(local_pool, server.url("/x.pdf")).pk)

    assert document.status == "failed" and f"Content-Encoding: {encoding}" in document.error
    assert server.header("Accept-Encoding") == "identity"


def test_a_body_without_a_length_is_capped_as_it_streams(hostile_peer, local_pool, settings):
    settings.OCR_MAX_FILE_BYTES = 1_000_000
    server = hostile_peer(hostile.endless)

    document = document_fetch(document_id=_url_job(local_pool, server.url("/x.pdf")).pk)

    assert document.status == "failed" and "limit of 1000000 bytes" in document.error


def _answer_when(go: threading.Event, body: bytes, *, trickle: bool = False):
    """A whole PDF, sent once the test says go; with ``trickle``, its trailing newlines a byte at a
    time until then (a download that goes on)."""

    def answer(peer, conn):
        peer.send(conn, b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + body)
        while not go.wait(hostile.TRICKLE_SECONDS):
            if trickle:
                peer.send(conn, b"\n")

    return answer


def _take_over(document_id: int) -> None:
    """What the scaler's recovery and a second fetch do to a fetch whose lease lapsed."""
    Document.objects.filter(pk=document_id).update(task_lease_token="second", task_lease_until=timezone.now()
                                                   + timedelta(minutes=5))  # fmt: skip


@pytest.mark.parametrize("when", ["downloading", "storing"])
def test_a_superseded_fetch_writes_nothing(hostile_peer, local_pool, settings, monkeypatch, transactional_db, when):
    go = threading.Event()
    server = hostile_peer(_answer_when(go, pdf_bytes()))
    document = _url_job(local_pool, server.url("/report.pdf"))
    if when == "storing":  # taken over between the download's last renewal and the save
        store = fetch.document_store
        monkeypatch.setattr(fetch, "document_store", lambda *args: (_take_over(document.pk), store(*args))[1])
        go.set()

    thread, outcome = _fetch_in_a_thread(document.pk)
    assert server.connected.wait(30)
    if when == "downloading":
        _take_over(document.pk)
        go.set()
    thread.join(60)

    assert not thread.is_alive() and outcome
    document.refresh_from_db()
    assert (document.kind, document.source, document.sha256, document.page_count, document.status) == (
        "url", "", "", 0, "pending")  # fmt: skip
    assert document.task_lease_token == "second" and not Page.objects.exists()
    stored = [path for path in (settings.MEDIA_ROOT / "documents").rglob("*") if path.is_file()]
    assert stored == []  # what it stored before it found out is deleted


def test_a_fetch_renews_its_lease_while_the_bytes_come_in(hostile_peer, local_pool, settings, transactional_db):
    settings.TASK_LEASE_SECONDS = 1.5  # renewed every 0.5 s of download at most
    go = threading.Event()
    server = hostile_peer(_answer_when(go, pdf_bytes(), trickle=True))
    document = _url_job(local_pool, server.url("/report.pdf"))

    thread, outcome = _fetch_in_a_thread(document.pk)
    try:
        assert server.connected.wait(30)
        first = Document.objects.get(pk=document.pk).task_lease_until
        deadline = timezone.now() + timedelta(seconds=30)
        while Document.objects.get(pk=document.pk).task_lease_until == first:
            assert timezone.now() < deadline, "the lease was never renewed during the download"
        assert thread.is_alive()  # renewed while the download still ran
    finally:
        go.set()
        thread.join(60)
    [fetched] = outcome
    assert (fetched.status, fetched.page_count) == ("split", 3), fetched.error


class _Killed(BaseException):
    """What a worker stopped mid-download leaves: the fetch started, and never finished."""


def test_a_document_whose_fetches_never_finish_fails_after_the_cap(local_pool, settings, monkeypatch, queued):
    settings.URL_FETCH_MAX_ATTEMPTS = 3
    document = _url_job(local_pool, "https://files.example.org/report.pdf")

    def killed(*args, **kwargs):
        raise _Killed

    monkeypatch.setattr(fetch, "_fetch_and_split", killed)
    for attempt in (1, 2, 3):
        with pytest.raises(_Killed):
            document_fetch(document_id=document.pk)
        Document.objects.filter(pk=document.pk).update(task_lease_until=timezone.now() - timedelta(seconds=1))
        sent_again = documents_recover(pool_id=local_pool.pk)
        document.refresh_from_db()
        assert document.fetch_attempts == attempt
        if attempt < 3:
            assert sent_again == [document.pk] and document.status == "pending"
            assert queued() == ["ocrjobs.tasks.fetch_document"] * attempt

    assert sent_again == [] and queued() == ["ocrjobs.tasks.fetch_document"] * 2  # not sent a third time
    assert document.status == "failed" and "started 3 times and never finished" in document.error
    assert Job.objects.get().status == Job.Status.FAILED


def test_a_fetch_task_sent_after_the_cap_fails_the_document_without_a_request(hostile_peer, local_pool, settings):
    settings.URL_FETCH_MAX_ATTEMPTS = 3
    server = hostile_peer(hostile.silent)
    document = _url_job(local_pool, server.url("/report.pdf"))
    Document.objects.filter(pk=document.pk).update(fetch_attempts=3)

    document = document_fetch(document_id=document.pk)

    assert document.status == "failed" and "started 3 times" in document.error
    assert server.requests == []


def test_a_fetch_waits_when_every_fetch_slot_is_held(hostile_peer, local_pool, settings, queued):
    settings.URL_FETCH_MAX_IN_FLIGHT = 1
    server = hostile_peer(hostile.silent)
    held = _url_job(local_pool, "https://files.example.org/slow.pdf")
    Document.objects.filter(pk=held.pk).update(task_lease_token="live", task_lease_until=timezone.now()
                                               + timedelta(minutes=5))  # fmt: skip
    waiting = _url_job(local_pool, server.url("/report.pdf"))

    document = document_fetch(document_id=waiting.pk)

    # The worker went back to other work without a request; the document waits, uncounted, and
    # is sent again once a slot is free (not by every tick while none is).
    assert document.status == "pending" and server.requests == []
    assert Document.objects.get(pk=waiting.pk).fetch_attempts == 0
    assert documents_recover(pool_id=local_pool.pk) == [] and queued() == []
    Document.objects.filter(pk=held.pk).update(status=Document.Status.FAILED)
    assert documents_recover(pool_id=local_pool.pk) == [waiting.pk]
    assert queued() == ["ocrjobs.tasks.fetch_document"]


def _owners_url_job(pool, owner, urls: list[str]) -> Job:
    return job_submit(owner=owner, pool_key=pool.key, uploads=[], urls=urls)


def test_one_owners_thousand_urls_hold_their_share_of_fetch_slots_and_anothers_url_starts_at_once(
    local_pool, ordinary_user, outsider, settings, queued, django_capture_on_commit_callbacks
):
    """Review N6: a job of 1,000 URLs is sent a fetch for its owner's share of the slots only, not
    a task a URL; another owner's URL document, submitted after, is sent at once."""
    settings.URL_FETCH_MAX_IN_FLIGHT, settings.URL_FETCH_MAX_IN_FLIGHT_PER_OWNER = 2, 1
    settings.URL_FETCH_MAX_IN_FLIGHT_PER_HOST = 2
    with django_capture_on_commit_callbacks(execute=True):
        flood = _owners_url_job(local_pool, ordinary_user, [f"https://tarpit.example/{n}.pdf" for n in range(1000)])
    assert queued() == ["ocrjobs.tasks.fetch_document"]  # one, not a thousand
    with django_capture_on_commit_callbacks(execute=True):
        theirs = _owners_url_job(local_pool, outsider, ["https://files.example.org/report.pdf"])
    assert queued() == ["ocrjobs.tasks.fetch_document"] * 2
    sent = Document.objects.exclude(task_lease_until__lt=timezone.now())
    assert {d.job_id for d in sent.filter(kind="url")} == {flood.pk, theirs.pk}
    assert documents_recover(pool_id=local_pool.pk) == []  # every slot is held: nothing more is sent


def test_a_fetch_that_ends_hands_its_slot_to_the_next_owner_in_turn(
    file_server, local_pool, ordinary_user, outsider, settings, queued, django_capture_on_commit_callbacks
):
    base, routes = file_server
    routes["/a.pdf"] = (200, {"Content-Type": "application/pdf"}, pdf_bytes([["fetched"]]))
    settings.URL_FETCH_ALLOW_PRIVATE = True
    settings.URL_FETCH_MAX_IN_FLIGHT = settings.URL_FETCH_MAX_IN_FLIGHT_PER_OWNER = 1
    with django_capture_on_commit_callbacks(execute=True):
        mine = _owners_url_job(local_pool, ordinary_user, [f"{base}/a.pdf"] * 3)
    with django_capture_on_commit_callbacks(execute=True):
        theirs = _owners_url_job(local_pool, outsider, [f"{base}/a.pdf"])
    first = mine.documents.order_by("position").first()
    assert queued() == ["ocrjobs.tasks.fetch_document"]

    with django_capture_on_commit_callbacks(execute=True):
        assert document_fetch(document_id=first.pk).status == "split"

    # The next in turn is the other owner's (holding none), not the first owner's second URL.
    (sent,) = Document.objects.filter(kind="url", status="pending", task_lease_until__gte=timezone.now())
    assert sent.job_id == theirs.pk
