"""The front's server (fleetadmin/front.py): Twisted's first parse of form bodies is off, the body
is handed to Django once, a body over the request limit gets a 413 before it is read, and start-up
refuses to serve if daphne did not take the front's factory. Through a real front, uploads arrive
whole and hashed, in memory or in a temporary file."""

from __future__ import annotations

import asyncio
import hashlib
import io
import os
import queue
import select
import socket
import time

import httpx
import pytest
from daphne.http_protocol import HTTPFactory
from django.core.exceptions import RequestAborted
from twisted.internet.defer import Deferred
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport

from accounts.models import ApiToken
from fleetadmin import front as front_module
from fleetadmin.asgi import BODY_EXTENSION, FrontASGIHandler, _handed_body
from fleetadmin.formdata import FormData
from fleetadmin.front import EVICTABLE_AFTER_SECONDS, READ_BYTES, FrontHTTPFactory, FrontServer, hand_over_body
from ocrjobs.models import Document
from ocrjobs.storage import document_bytes
from tests.factories import pdf_bytes
from tests.fleetadmin.helpers import closed_within
from tools.processes import child_env, start_front, wait_for


@pytest.fixture
def front(transactional_db, local_pool, media_root, tmp_path, request):
    """The front on the test database, with the child settings the test parametrizes."""
    env = child_env(tmp_path, **getattr(request, "param", {}))
    process, url = start_front(env, tmp_path)
    yield url
    process.stop()


@pytest.fixture
def front_process(transactional_db, local_pool, media_root, tmp_path):
    """The front on the test database: its process and its URL."""
    process, url = start_front(child_env(tmp_path), tmp_path)
    yield process, url
    process.stop()


@pytest.fixture
def token(transactional_db) -> str:
    from django.contrib.auth.models import User

    user = User.objects.create_user("uploader", password="x")
    return ApiToken.issue(user=user, name="test", scopes=["read", "submit"])[1]


def _unique_pdf(n: int, padding: int = 0) -> bytes:
    # A comment after %%EOF: a PDF of its own that reads the same (as bench/ingest.py makes them).
    return pdf_bytes() + f"\n% body test {n} ".encode() + os.urandom(padding).hex().encode() + b"\n"


@pytest.mark.parametrize("padding", [0, 300_000], ids=["in-memory", "temporary-file"])
def test_every_uploaded_byte_is_stored_and_hashed(front, token, padding):
    # Twisted keeps a body under 100 kB in memory, a larger one in a temporary file.
    documents = [_unique_pdf(n, padding=padding * n) for n in range(3)]
    files = [("files", (f"d{n}.pdf", data, "application/pdf")) for n, data in enumerate(documents)]

    response = httpx.post(f"{front}/v1/jobs", files=files, headers={"Authorization": f"Bearer {token}"}, timeout=60)

    assert response.status_code == 201, response.text
    stored = list(Document.objects.order_by("position"))
    assert [d.size_bytes for d in stored] == [len(data) for data in documents]
    assert [d.sha256 for d in stored] == [hashlib.sha256(data).hexdigest() for data in documents]
    assert [document_bytes(d.source) for d in stored] == documents


@pytest.mark.parametrize("front", [{"OCR_MAX_REQUEST_BYTES": "200000"}], indirect=True)
def test_a_body_over_the_request_limit_is_a_json_413(front, token):
    files = [("files", ("big.pdf", _unique_pdf(0, padding=150_000), "application/pdf"))]

    response = httpx.post(f"{front}/v1/jobs", files=files, headers={"Authorization": f"Bearer {token}"}, timeout=60)

    assert response.status_code == 413, response.text
    assert response.headers["Content-Type"] == "application/json"
    assert "larger than the limit" in response.json()["error"]
    assert not Document.objects.exists()


def _answer(sock: socket.socket) -> bytes:
    sock.settimeout(30)
    answer = b""
    while chunk := sock.recv(65536):
        answer += chunk
    return answer


@pytest.mark.parametrize("front", [{"OCR_MAX_REQUEST_BYTES": "200000"}], indirect=True)
def test_a_too_large_content_length_gets_its_413_before_a_byte_of_the_body_is_sent(front):
    host, port = front.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(b"POST /v1/jobs HTTP/1.1\r\nHost: front\r\nContent-Type: multipart/form-data; boundary=x\r\n"
                     b"Content-Length: 200001\r\n\r\n")  # fmt: skip

        answer = _answer(sock)  # no body sent: the front answers and closes its side

    assert answer.startswith(b"HTTP/1.1 413 ")
    assert b'"error": "the request is larger than the limit of 200000 bytes"' in answer


@pytest.mark.parametrize("front", [{"OCR_MAX_REQUEST_BYTES": "200000"}], indirect=True)
def test_a_chunked_body_gets_its_413_once_it_passes_the_limit(front):
    host, port = front.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(b"POST /v1/jobs HTTP/1.1\r\nHost: front\r\nTransfer-Encoding: chunked\r\n\r\n")
        sock.sendall(b"%x\r\n%s\r\n" % (150_000, b"x" * 150_000) * 2)  # 300 kB, and no last chunk

        answer = _answer(sock)

    assert answer.startswith(b"HTTP/1.1 413 ")


SLOW = {
    "FRONT_HEADER_TIMEOUT_SECONDS": "2",
    "FRONT_BODY_GRACE_SECONDS": "1",
    "FRONT_BODY_MIN_BYTES_PER_SECOND": "50000",
}


@pytest.mark.parametrize("front", [SLOW], indirect=True)
def test_a_client_that_never_finishes_its_headers_is_cut_off_and_the_front_answers_others(front):
    host, port = front.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(b"POST /v1/jobs HTTP/1.1\r\nHost: front\r\n")  # and no more: its headers never end
        assert httpx.get(f"{front}/healthz", timeout=10).status_code == 200

        assert closed_within(sock, 30) == b""  # no request, nothing to answer


@pytest.mark.parametrize("front", [SLOW], indirect=True)
def test_a_body_that_trickles_gets_a_json_408_and_nothing_is_stored(front, token):
    host, port = front.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(b"POST /v1/jobs HTTP/1.1\r\nHost: front\r\nAuthorization: Bearer %s\r\n"
                     b"Content-Type: multipart/form-data; boundary=x\r\nContent-Length: 1000000\r\n\r\n"
                     % token.encode())  # fmt: skip
        sock.sendall(b"--x\r\n")  # then nothing: far under 50 kB/s once its second of grace is over

        answer = closed_within(sock, 30)

    assert answer.startswith(b"HTTP/1.1 408 "), answer
    assert b"slower than 50000 bytes/s" in answer
    assert not Document.objects.exists()


def _hold(token: str) -> bytes:
    """An upload's head (a body over FRONT_SMALL_BODY_BYTES, from an uploader): a body begun, never sent."""
    return (b"POST /v1/jobs HTTP/1.1\r\nHost: front\r\nAuthorization: Bearer %s\r\n"
            b"Content-Type: multipart/form-data; boundary=x\r\nContent-Length: 1000000\r\n\r\n" % token.encode())  # fmt: skip


def _upload(front: str, token: str) -> httpx.Response:
    # Over FRONT_SMALL_BODY_BYTES once written in hex: an upload, which takes an upload's place.
    files = [("files", ("d.pdf", _unique_pdf(0, padding=40_000), "application/pdf"))]
    return httpx.post(f"{front}/v1/jobs", files=files, headers={"Authorization": f"Bearer {token}"}, timeout=60)


# No minimum rate: the bodies held are never behind it, so none gives its place up.
@pytest.mark.parametrize("front", [{"FRONT_MAX_BODIES_IN_FLIGHT": "2", "FRONT_BODY_MIN_BYTES_PER_SECOND": "0"}],
                         indirect=True)  # fmt: skip
def test_uploads_past_the_limit_in_flight_get_a_503_before_they_are_read(front, token):
    host, port = front.removeprefix("http://").split(":")
    holding = [socket.create_connection((host, int(port))) for _ in range(2)]
    try:
        for sock in holding:
            sock.sendall(_hold(token))  # two bodies begun, not finished
        with socket.create_connection((host, int(port))) as third:
            # (the front reads the first two before the third: one more round trip to be sure)
            assert httpx.get(f"{front}/healthz", timeout=10).status_code == 200
            third.sendall(_hold(token))

            answer = closed_within(third, 30)

        assert answer.startswith(b"HTTP/1.1 503 "), answer
        assert b"Retry-After: 1" in answer
    finally:
        for sock in holding:
            sock.close()
    # Their places are free once they hang up.
    assert wait_for(lambda: _upload(front, token).status_code == 201, 30, "the upload was still refused")


# A grace longer than the test: only the eviction can free a place.
@pytest.mark.parametrize("front", [{"FRONT_MAX_BODIES_IN_FLIGHT": "2", "FRONT_BODY_GRACE_SECONDS": "300",
                                    "FRONT_BODY_MIN_BYTES_PER_SECOND": "50000"}], indirect=True)  # fmt: skip
def test_when_every_place_is_held_the_slowest_body_behind_the_rate_gives_its_place_to_an_upload(front, token):
    host, port = front.removeprefix("http://").split(":")
    holding = [socket.create_connection((host, int(port))) for _ in range(2)]
    try:
        for sock in holding:
            sock.sendall(_hold(token))
        assert httpx.get(f"{front}/healthz", timeout=10).status_code == 200  # (the front has read both)
        time.sleep(EVICTABLE_AFTER_SECONDS + 0.5)  # both behind the rate for longer than that, by now

        assert _upload(front, token).status_code == 201

        readable, _, _ = select.select(holding, [], [], 30)
        assert len(readable) == 1, "one slow body, and one only, was cut off"
        answer = closed_within(readable[0], 30)
        assert answer.startswith(b"HTTP/1.1 408 ") and b"while every upload slot was taken" in answer, answer
    finally:
        for sock in holding:
            sock.close()


@pytest.mark.parametrize("front", [SLOW], indirect=True)
def test_a_websocket_outlives_the_header_deadline(front):
    from django.contrib.auth.models import User
    from django.test import Client

    client = Client()
    client.force_login(User.objects.create_user("watcher", password="x", is_staff=True))
    cookie = client.cookies["sessionid"].value

    async def watch() -> bool:
        import aiohttp

        async with aiohttp.ClientSession(cookies={"sessionid": cookie}) as session:
            async with session.ws_connect(f"{front.replace('http', 'ws')}/ws/dashboard", origin=front) as ws:
                await asyncio.sleep(4)  # twice the header deadline, and its check
                try:  # a connection the front cut reads as closed at once
                    message = await ws.receive(timeout=1.0)
                except TimeoutError:
                    return True
                return message.type in (aiohttp.WSMsgType.TEXT, aiohttp.WSMsgType.BINARY)

    assert asyncio.run(watch())


class _Server:
    """What daphne's WebRequest asks of its server, up to handing the request over (the front's way)."""

    proxy_forwarded_address_header = None
    root_path = ""
    request_buffer_size = 65536

    def __init__(self) -> None:
        self.requests: list = []
        self.scopes: list[dict] = []

    def protocol_connected(self, protocol):
        pass

    def create_application(self, protocol, scope):
        hand_over_body(protocol, scope)
        self.requests.append(protocol)
        self.scopes.append(scope)
        return queue.SimpleQueue()


class _Transport(StringTransport):
    def loseWriteConnection(self) -> None:  # (a refusal's: what Twisted's TCP transport has)
        self.disconnecting = True


def _post(
    factory: HTTPFactory,
    body: bytes,
    *,
    method: bytes = b"POST",
    content_type: bytes = b"multipart/form-data; boundary=b0",
):
    """A POST (or ``method``) of ``body`` through one of ``factory``'s connections (its server a
    _Server); the request daphne made of it, and what was answered on the connection."""
    factory.timeOut = None
    channel = factory.buildProtocol(None)
    channel.callLater = Clock().callLater  # (a refusal's later close: never run here)
    transport = _Transport()
    channel.makeConnection(transport)
    head = b"%s /v1/jobs HTTP/1.1\r\nHost: front\r\nContent-Type: %s\r\n" % (method, content_type)
    channel.dataReceived(head + b"Content-Length: %d\r\n\r\n" % len(body) + body)
    return (factory.server.requests or [None])[-1], transport.value()


FORM = b'--b0\r\nContent-Disposition: form-data; name="pool"\r\n\r\nlocal\r\n--b0--\r\n'


def test_a_multipart_post_is_read_as_it_arrives_twisted_leaves_its_args_empty_and_the_form_is_handed_over():
    stock, _ = _post(HTTPFactory(_Server()), FORM)
    server = _Server()
    front, _ = _post(FrontHTTPFactory(server), FORM)

    assert stock.args == {b"pool": [b"local"]}  # Twisted's own parse, which daphne never reads
    assert front.args == {}  # off: the front's form reader is the one that reads the body
    handed = server.scopes[-1]["extensions"][BODY_EXTENSION]
    assert isinstance(handed, FormData)  # no temporary file of the whole body to read back
    assert handed.read() == b""  # daphne queues one empty message
    post, files = handed.finish()
    assert (post.dict(), files.dict()) == ({"pool": "local"}, {})


def test_a_body_that_is_not_a_form_is_handed_over_as_twisted_received_it():
    server = _Server()
    _post(FrontHTTPFactory(server), b'{"urls": []}', content_type=b"application/json")

    handed = server.scopes[-1]["extensions"][BODY_EXTENSION]
    assert handed.read() == b""  # at its end: daphne queues one empty message
    handed.seek(0)
    assert handed.read() == b'{"urls": []}'


def test_a_form_sent_with_another_method_than_post_gets_a_json_400_and_its_files_are_dropped(tmp_path, settings):
    spool = tmp_path / "spool"
    spool.mkdir()
    settings.FILE_UPLOAD_TEMP_DIR = str(spool)
    form = b'--b0\r\nContent-Disposition: form-data; name="files"; filename="a.pdf"\r\n\r\n%PDF-\r\n--b0--\r\n'
    server = _Server()

    request, answer = _post(FrontHTTPFactory(server), form, method=b"PUT")

    assert request is None  # never handed to Django, whose request.body would read empty
    assert answer.startswith(b"HTTP/1.1 400 Bad Request") and b"POST only" in answer
    assert list(spool.iterdir()) == []


def _written_bytes(pid: int) -> int:
    """What the process has written with write() and its kin, files and sockets alike."""
    with open(f"/proc/{pid}/io") as io_counts:
        return int(next(line for line in io_counts if line.startswith("wchar:")).split()[1])


def test_the_front_writes_an_uploads_bytes_once(front_process, token):
    # Before the form was read as it arrived, a body went to Twisted's temporary file, and each of
    # its files out again (Django's parser's temporary file, or the staging when it kept them in
    # memory): the front wrote every uploaded byte twice (bench/uploads.py: 5.8-6.9 ms of CPU a MB).
    process, url = front_process
    documents = [_unique_pdf(n, padding=500_000) for n in range(3)]  # 1 MB each once written in hex
    files = [("files", (f"d{n}.pdf", data, "application/pdf")) for n, data in enumerate(documents)]
    headers = {"Authorization": f"Bearer {token}"}
    warm = httpx.post(f"{url}/v1/jobs", files=files[:1], headers=headers, timeout=60)  # (first-request writes)
    assert warm.status_code == 201, warm.text
    before = _written_bytes(process.pid)

    response = httpx.post(f"{url}/v1/jobs", files=files, headers=headers, timeout=60)

    assert response.status_code == 201, response.text
    uploaded = sum(len(data) for data in documents)
    # Once, and what a job's rows, its tasks and the answer take (~30 kB on SQLite).
    assert _written_bytes(process.pid) - before < uploaded + 256 * 1024


def test_a_connection_reads_up_to_read_bytes_at_a_time():
    # Twisted's 64 KiB reads cost a dozen Python calls each on the way to an upload's form.
    channel = FrontHTTPFactory(_Server()).buildProtocol(None)
    channel.makeConnection(_Transport())

    assert channel.transport.bufferSize == READ_BYTES == 256 * 1024


def test_start_up_fails_unless_daphne_listens_with_the_fronts_factory():
    server = FrontServer(application=None, endpoints=["tcp:port=0"])
    with pytest.raises(RuntimeError, match="FrontHTTPFactory"):
        server.check_hooks()  # run() made no factory yet

    server.http_factory = HTTPFactory(server)  # what daphne's run() does

    assert isinstance(server.http_factory, FrontHTTPFactory)
    server.check_hooks()


def _receive(messages: list[dict]):
    pending = list(messages)

    async def receive():
        return pending.pop(0)

    return receive


def _read_body(handed, messages: list[dict]):
    async def read():
        _handed_body.set(handed)
        return await FrontASGIHandler().read_body(_receive(messages))

    return asyncio.run(read())


def test_a_handed_over_body_is_the_body_file_read_from_its_start():
    handed = io.BytesIO()
    handed.write(b"the whole body")

    body = _read_body(handed, [{"type": "http.request", "body": b"", "more_body": False}])

    assert body is handed
    assert body.read() == b"the whole body"


def test_without_a_handed_over_body_the_messages_are_read_as_django_does():
    messages = [{"type": "http.request", "body": b"abc", "more_body": True}, {"type": "http.request", "body": b"def"}]

    assert _read_body(None, messages).read() == b"abcdef"


def test_a_disconnect_before_the_body_is_taken_closes_the_handed_over_body():
    handed = io.BytesIO(b"x")

    with pytest.raises(RequestAborted):
        _read_body(handed, [{"type": "http.disconnect"}])

    assert handed.closed


def _begin_upload(factory: FrontHTTPFactory, token: str = "fa_any") -> tuple[object, _Transport]:
    """An upload's head and a first piece of its body on a new connection: its request, its transport."""
    factory.timeOut = None
    channel = factory.buildProtocol(None)
    channel.callLater = Clock().callLater
    transport = _Transport()
    channel.makeConnection(transport)
    channel.dataReceived(b"POST /v1/jobs HTTP/1.1\r\nHost: front\r\nAuthorization: Bearer %s\r\n"
                         b"Content-Length: 1000000\r\n\r\n--b0" % token.encode())  # fmt: skip
    return channel.requests[-1], transport


def test_uploads_whose_callers_are_being_checked_have_a_budget_and_keep_one_read_of_their_body(monkeypatch, settings):
    settings.FRONT_MAX_BODIES_IN_FLIGHT = 1
    checks = []
    monkeypatch.setattr(front_module.threads, "deferToThread", lambda *args: checks.append(args) or Deferred())
    factory = FrontHTTPFactory(_Server())

    first, first_transport = _begin_upload(factory)
    second, second_transport = _begin_upload(factory)

    assert checks == [(front_module.check_uploader, "Bearer fa_any", "")]  # one check, on a thread
    assert first.checking and first.early == [b"--b0"] and first_transport.producerState == "paused"
    assert first_transport.value() == b""  # nothing answered while the caller is checked
    assert second_transport.value().startswith(b"HTTP/1.1 503 ")  # before its body is read
    assert second.early == []
