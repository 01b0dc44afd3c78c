"""Request bodies in the front (fleetadmin/bodies.py): through a real daphne, a body kept in memory
and one over the in-memory cap (on disk) both arrive whole and hashed; limits answer as before;
and Django's handler takes a handed-over body, or reads the messages when there is none."""

from __future__ import annotations

import asyncio
import hashlib
import io
import os
import queue
import socket
import threading

import httpx
import pytest
from django.core.exceptions import RequestAborted

from accounts.models import ApiToken
from fleetadmin.bodies import RECEIVE_BYTES, BodyBuffers, BodyInMemory, FrontASGIHandler, _handed_body, patch_daphne
from ocrjobs.models import Document
from ocrjobs.storage import document_bytes
from tests.factories import pdf_bytes
from tools.processes import child_env, start_front


@pytest.fixture
def front(transactional_db, local_pool, media_root, tmp_path, request):
    """daphne on the test database, with the child settings the test parametrizes."""
    env = child_env(tmp_path, **getattr(request, "param", {}))
    process, url = start_front(env, tmp_path)
    yield url
    process.stop()


@pytest.fixture
def token(transactional_db) -> str:
    from django.contrib.auth.models import User

    user = User.objects.create_user("uploader", password="x")
    return ApiToken.issue(user=user, name="test", scopes=["read", "submit"])[1]


def _unique_pdf(n: int, padding: int = 0) -> bytes:
    # A comment after %%EOF: a PDF of its own that reads the same (as bench/ingest.py makes them).
    return pdf_bytes() + f"\n% body test {n} ".encode() + os.urandom(padding).hex().encode() + b"\n"


@pytest.mark.parametrize(
    "front",
    [{}, {"REQUEST_BODY_MEMORY_BYTES": "1000"}, {"REQUEST_BODY_MEMORY_BYTES": "0"}],
    ids=["in-memory", "over-the-cap", "always-on-disk"],
    indirect=True,
)
def test_every_uploaded_byte_is_stored_and_hashed_in_memory_or_over_the_cap(front, token):
    documents = [_unique_pdf(n, padding=300_000 * n) for n in range(3)]  # up to ~2 MB: several chunks
    files = [("files", (f"d{n}.pdf", data, "application/pdf")) for n, data in enumerate(documents)]

    response = httpx.post(f"{front}/v1/jobs", files=files, headers={"Authorization": f"Bearer {token}"}, timeout=60)

    assert response.status_code == 201, response.text
    stored = list(Document.objects.order_by("position"))
    assert [d.size_bytes for d in stored] == [len(data) for data in documents]
    assert [d.sha256 for d in stored] == [hashlib.sha256(data).hexdigest() for data in documents]
    assert [document_bytes(d.source) for d in stored] == documents


@pytest.mark.parametrize(
    "front",
    [{"OCR_MAX_REQUEST_BYTES": "200000"}, {"OCR_MAX_REQUEST_BYTES": "200000", "REQUEST_BODY_MEMORY_BYTES": "1000"}],
    ids=["in-memory", "over-the-cap"],
    indirect=True,
)
def test_a_body_over_the_request_limit_is_still_a_json_413(front, token):
    files = [("files", ("big.pdf", _unique_pdf(0, padding=150_000), "application/pdf"))]

    response = httpx.post(f"{front}/v1/jobs", files=files, headers={"Authorization": f"Bearer {token}"}, timeout=60)

    assert response.status_code == 413, response.text
    assert response.headers["Content-Type"] == "application/json"
    assert "larger than the limit" in response.json()["error"]
    assert not Document.objects.exists()


def _receive(messages: list[dict]):
    queue = list(messages)

    async def receive():
        return queue.pop(0)

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


def test_a_body_in_memory_reads_as_a_file_once_its_chunks_are_in():
    body = BodyInMemory(len(b"first second third"))
    for chunk in (b"first ", b"second ", b"third"):
        body.write(chunk)

    assert body.tell() == len(b"first second third")  # what twisted takes as the body's length
    body.seek(0, 0)
    assert body.read(6) == b"first "
    assert body.file().read() == b"second third"
    assert body.file().body == bytearray(b"first second third")  # the buffer itself, for the parser
    assert not body.closed
    body.close()
    assert body.closed


def test_a_body_in_memory_is_read_from_the_socket_into_its_buffer():
    data = os.urandom(300_000)
    body = BodyInMemory(len(data))
    sender, receiver = socket.socketpair()
    with sender, receiver:
        sending = threading.Thread(target=sender.sendall, args=(data,))
        sending.start()
        while body.left():
            body.receive(receiver, 100_000)
        sending.join()

    assert body.tell() == len(data)
    assert body.file().body == data
    body.seek(0)
    assert body.readline() + body.read() == data  # as Django reads a body it does not parse in place


MiB = 1024 * 1024


def _body(buffers: BodyBuffers, data: bytes, length: int | None = None) -> BodyInMemory:
    body = BodyInMemory(len(data) if length is None else length, buffers=buffers)
    body.write(data)
    return body


def _read(body: BodyInMemory) -> bytes:
    body.seek(0)
    return body.read()


def test_a_kept_buffer_serves_the_next_body_and_shows_only_what_that_body_received(settings):
    settings.REQUEST_BODY_KEEP_BYTES = 64 * MiB
    buffers = BodyBuffers()
    first, second = os.urandom(3 * MiB), os.urandom(2 * MiB)
    body = _body(buffers, first)
    assert _read(body) == first
    body.close()
    del body

    body = _body(buffers, second, length=3 * MiB)  # cut short: 2 MiB of the 3 it announced came

    [kept] = buffers.kept()
    assert body.file().body is kept  # the first body's buffer, not zeroed, not a new one
    assert _read(body) == second  # and nothing of the first body's bytes after it
    assert bytes(body.file().body) == second


def test_a_buffer_some_view_still_reads_is_never_handed_to_another_body(settings):
    settings.REQUEST_BODY_KEEP_BYTES = 64 * MiB
    buffers = BodyBuffers()
    first = os.urandom(2 * MiB)
    body = _body(buffers, first)
    view = memoryview(body.file().body)[100:200]  # as a file parsed from the body points into it
    first_buffer = id(body.file().body)
    body.close()
    del body

    other = _body(buffers, os.urandom(2 * MiB))

    assert id(other.file().body) != first_buffer
    assert view.tobytes() == first[100:200]
    view.release()
    assert id(_body(buffers, os.urandom(2 * MiB)).file().body) == first_buffer  # free once the view is gone


def test_the_kept_buffers_stay_within_the_kept_bytes(settings):
    settings.REQUEST_BODY_KEEP_BYTES = 6 * MiB
    buffers = BodyBuffers()

    bodies = [_body(buffers, os.urandom(2 * MiB)) for _ in range(4)]  # 2.5 MiB allocated each

    assert len(buffers.kept()) == 2
    assert all(_read(body) == body.file().body for body in bodies)
    del bodies
    big = _body(buffers, os.urandom(4 * MiB))  # 5 MiB: room made from the free ones
    assert buffers.kept() == [big.file().body]


class _Server:
    """What daphne's WebRequest asks of its server, up to handing the request over."""

    proxy_forwarded_address_header = None
    root_path = ""
    request_buffer_size = 65536

    def protocol_connected(self, protocol):
        pass

    def create_application(self, protocol, scope):
        return queue.SimpleQueue()


def test_once_a_large_body_is_in_the_connection_reads_the_next_head_in_small_reads():
    from daphne import http_protocol, server  # noqa: F401  (what patch_daphne patches)
    from twisted.internet.testing import StringTransport

    patch_daphne()
    factory = http_protocol.HTTPFactory(_Server())
    factory.timeOut = None
    channel = factory.buildProtocol(None)
    transport = StringTransport()
    channel.makeConnection(transport)
    body = os.urandom(RECEIVE_BYTES + 1)

    channel.dataReceived(b"POST /v1/jobs HTTP/1.1\r\nHost: front\r\nContent-Length: %d\r\n\r\n" % len(body))
    assert transport.bufferSize == RECEIVE_BYTES  # the body, read 1 MiB at a time
    channel.dataReceived(body)

    assert "bufferSize" not in vars(transport)  # the next request's head: twisted's own 64 KiB again


def test_bodies_cut_short_leave_no_buffer_that_serves_no_body_in_the_kept_list(settings):
    settings.REQUEST_BODY_KEEP_BYTES = 64 * MiB
    buffers = BodyBuffers()
    for _ in range(20):  # clients that announce 2 MiB and hang up after a few bytes
        body = _body(buffers, b"x" * 10, length=2 * MiB)
        assert _read(body) == b"x" * 10
        body.close()
        del body

    # The cut-short buffer shrank to what came (CPython reallocs below half its allocation): it can
    # serve no body of BodyBuffers.SMALLEST or more, and is not kept one body after another.
    assert len(buffers.kept()) <= 1
