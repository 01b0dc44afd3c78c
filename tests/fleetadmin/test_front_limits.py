"""What one client or one user may hold of the front's bodies in flight (issue 38, N1; invariant
19), through a real front on real sockets: a large body is taken only by an upload path from a
caller known before its body is read, small bodies have a budget of their own, bodies are capped
per client address (the proxy's with --proxy-headers) and uploads per user, and every body has a
total time. The review's attack (64 connections announcing 2 GB and trickling) gave every login
a 503."""

from __future__ import annotations

import socket

import httpx
import pytest

from accounts.models import ApiToken
from ocrjobs.models import Document
from tests.factories import pdf_bytes
from tests.fleetadmin.helpers import closed_within
from tools.processes import child_env, start_front, wait_for

PASSWORD = "a long enough password"
# No minimum rate: a held body is never behind it, as the review's bodies (10 kB/s) were not.
# And a small body's total time longer than any test: only the test of it cuts one off.
HELD = {"FRONT_BODY_MIN_BYTES_PER_SECOND": "0", "FRONT_SMALL_BODY_SECONDS": "300"}
ANSWER_SECONDS = 20  # a bound for an answer the front gives at once (its checks run once a second)


@pytest.fixture
def front(transactional_db, local_pool, media_root, tmp_path, request):
    """The front on the test database, with the child settings (and daphne options) the test parametrizes."""
    param = dict(getattr(request, "param", {}))
    options = tuple(param.pop("options", ()))
    process, url = start_front(child_env(tmp_path, **param), tmp_path, options=options)
    yield url
    process.stop()


@pytest.fixture
def users(transactional_db):
    from django.contrib.auth.models import User

    return [User.objects.create_user(name, password=PASSWORD) for name in ("ann", "bob")]


def _token(user, scopes=("read", "submit")) -> str:
    return ApiToken.issue(user=user, name="test", scopes=list(scopes))[1]


def _address(front: str) -> tuple[str, int]:
    host, port = front.removeprefix("http://").split(":")
    return host, int(port)


def _connect(front: str, source: str = "127.0.0.1") -> socket.socket:
    """A connection to the front from ``source`` (any address of 127/8 is this machine's)."""
    return socket.create_connection(_address(front), source_address=(source, 0))


def _head(path: str, length: int, *headers: str, method: str = "POST") -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", "Content-Type: application/x-www-form-urlencoded",
             f"Content-Length: {length}", *headers]  # fmt: skip
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def _answer(sock: socket.socket) -> bytes:
    """What the front answered before it closed its side, which it must do within ANSWER_SECONDS."""
    return closed_within(sock, ANSWER_SECONDS)


def _unanswered(sockets: list[socket.socket]) -> bool:
    """Whether the front has sent nothing on any of them: each still being received."""
    for sock in sockets:
        sock.settimeout(0.0)
        try:
            if sock.recv(1, socket.MSG_PEEK):
                return False
        except BlockingIOError:
            continue
    return True


def _login(front: str, *, source: str = "127.0.0.1", headers: dict | None = None) -> httpx.Response:
    """A real login (the form's GET for its CSRF token, then its POST): Django's redirect, or the refusal."""
    transport = httpx.HTTPTransport(local_address=source)
    with httpx.Client(base_url=front, transport=transport, headers=headers or {}, timeout=30) as client:
        form = client.get("/login/")
        assert form.status_code == 200, form.text
        csrf = client.cookies["csrftoken"]
        return client.post("/login/", data={"username": "ann", "password": PASSWORD, "csrfmiddlewaretoken": csrf})


def _files(n: int = 0, padding: int = 40_000) -> list:
    # Over FRONT_SMALL_BODY_BYTES (64 kB) once written in hex: an upload.
    data = pdf_bytes() + f"\n% limits {n} ".encode() + b"ab" * padding + b"\n"
    return [("files", (f"d{n}.pdf", data, "application/pdf"))]


def _upload(front: str, token: str, n: int = 0) -> httpx.Response:
    return httpx.post(f"{front}/v1/jobs", files=_files(n), headers={"Authorization": f"Bearer {token}"}, timeout=60)


def _hold_upload(front: str, token: str) -> socket.socket:
    """An upload begun and never finished: its head, and a byte of its body."""
    sock = _connect(front)
    sock.sendall(_head("/v1/jobs", 1_000_000, f"Authorization: Bearer {token}") + b"-")
    return sock


@pytest.mark.parametrize("front", [HELD], indirect=True)
def test_with_64_slow_unauthenticated_bodies_in_flight_a_login_is_answered(front, users):
    # The review's attack, each connection from an address of its own: 64 bodies announcing 2 GB
    # (to the login, the API's upload and the job form: each refused before a byte is read), and
    # 64 small ones begun and held (which a budget of their own takes). Before, the 2 GB bodies
    # held every place and the login got a 503.
    paths = ["/login/", "/v1/jobs", "/jobs/new", "/healthz"]
    large = [_connect(front, f"127.0.2.{n + 1}") for n in range(64)]
    small = [_connect(front, f"127.0.3.{n + 1}") for n in range(64)]
    try:
        for n, sock in enumerate(large):
            sock.sendall(_head(paths[n % len(paths)], 2_000_000_000) + b"x" * 1000)
        for sock in small:
            sock.sendall(_head("/login/", 60_000) + b"username=")
        assert httpx.get(f"{front}/healthz", timeout=10).status_code == 200  # (the front has read them all)

        login = _login(front)

        assert login.status_code == 302, login.text
        assert login.headers["Location"] == "/"
        statuses = sorted({_answer(sock).split(b" ", 2)[1] for sock in large})
        assert statuses == [b"401", b"413"]  # (401: an upload path with no caller; 413: the others)
        assert _unanswered(small), "the small bodies are held, as the login's was"
    finally:
        for sock in large + small:
            sock.close()


@pytest.mark.parametrize(
    ("path", "headers", "status", "says"),
    [
        ("/login/", (), b"413", b"text/html"),
        ("/healthz", (), b"413", b"application/json"),
        ("/v1/runpod/scale", ("Authorization: Bearer {token}",), b"413", b"application/json"),
        ("/v1/jobs", (), b"401", b"application/json"),
        ("/v1/jobs", ("Authorization: Bearer fa_not-a-token",), b"401", b"application/json"),
        ("/v1/jobs", ("Authorization: Bearer {read_token}",), b"401", b"application/json"),
        ("/jobs/new", ("Cookie: sessionid=not-a-session",), b"401", b"text/html"),
    ],
    ids=["login", "healthz", "not-an-upload-path", "no-caller", "unknown-token", "read-only-token", "no-session"],
)
def test_a_large_body_without_an_uploader_on_an_upload_path_is_refused_before_it_is_read(
    front, users, path, headers, status, says
):
    known = {"token": _token(users[0]), "read_token": _token(users[0], ("read",))}
    with _connect(front) as sock:
        sock.sendall(_head(path, 1_000_000, *(h.format(**known) for h in headers)))  # and not a byte of the body

        answer = _answer(sock)

    assert answer.startswith(b"HTTP/1.1 " + status + b" "), answer
    assert b"Content-Type: " + says in answer
    assert b"65536 bytes" in answer
    assert not Document.objects.exists()


def test_a_chunked_body_that_is_not_an_upload_gets_its_413_once_it_passes_the_small_limit(front):
    with _connect(front) as sock:
        sock.sendall(b"POST /login/ HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\n")
        sock.sendall(b"%x\r\n%s\r\n" % (40_000, b"x" * 40_000) * 2)  # 80 kB, and no last chunk

        answer = _answer(sock)

    assert answer.startswith(b"HTTP/1.1 413 "), answer
    assert b"a body over 65536 bytes is taken only by an upload" in answer


def test_an_uploader_known_by_a_session_or_a_token_sends_a_large_body(front, users):
    # A browser's session (the API's CSRF check as ever) ...
    transport = httpx.HTTPTransport()
    with httpx.Client(base_url=front, transport=transport, timeout=60) as client:
        client.post("/login/", data={"username": "ann", "password": PASSWORD,
                                     "csrfmiddlewaretoken": client.get("/login/").cookies["csrftoken"]})  # fmt: skip
        assert "sessionid" in client.cookies
        by_session = client.post("/v1/jobs", files=_files(0), headers={"X-CSRFToken": client.cookies["csrftoken"]})
    assert by_session.status_code == 201, by_session.text

    # ... and a token, whose client waits for the 100-continue the front sends once it is known.
    boundary = "b0"
    data = _files(1)[0][1][1]
    body = (f'--{boundary}\r\nContent-Disposition: form-data; name="files"; filename="e.pdf"\r\n'
            "Content-Type: application/pdf\r\n\r\n").encode() + data + f"\r\n--{boundary}--\r\n".encode()  # fmt: skip
    with _connect(front) as sock:
        sock.sendall(_head("/v1/jobs", len(body), f"Authorization: Bearer {_token(users[1])}",
                           "Expect: 100-continue", "Connection: close").replace(b"application/x-www-form-urlencoded",
                                                           f"multipart/form-data; boundary={boundary}".encode()))  # fmt: skip
        sock.settimeout(ANSWER_SECONDS)
        assert sock.recv(4096) == b"HTTP/1.1 100 Continue\r\n\r\n"
        sock.sendall(body)

        answer = _answer(sock)

    assert answer.startswith(b"HTTP/1.1 201 "), answer
    assert Document.objects.count() == 2


@pytest.mark.parametrize(
    ("front", "forwarded"),
    [
        ({**HELD, "FRONT_MAX_BODIES_PER_CLIENT": "2"}, None),
        ({**HELD, "FRONT_MAX_BODIES_PER_CLIENT": "2", "options": ["--proxy-headers"]}, "X-Forwarded-For"),
    ],
    indirect=["front"],
    ids=["connection-address", "proxy-header"],
)
def test_a_client_address_has_its_most_bodies_in_flight_and_others_are_served(front, users, forwarded):
    # Behind a proxy every connection is the proxy's: the client is the proxy's header.
    def source(client: str) -> tuple[str, tuple[str, ...], dict]:
        if forwarded:
            return "127.0.0.1", (f"{forwarded}: {client}",), {forwarded: client}
        return client, (), {}

    address, headers, _ = source("127.0.0.5")
    held = [_connect(front, address) for _ in range(2)]
    try:
        for sock in held:
            sock.sendall(_head("/login/", 1000, *headers) + b"username=")
        with _connect(front, address) as third:
            assert httpx.get(f"{front}/healthz", timeout=10).status_code == 200  # (the first two read)
            third.sendall(_head("/login/", 1000, *headers))

            answer = _answer(third)

        assert answer.startswith(b"HTTP/1.1 429 "), answer
        assert b"Retry-After: 1" in answer and b"2 bodies from this address" in answer
        address, _, login_headers = source("127.0.0.6")
        assert _login(front, source=address, headers=login_headers).status_code == 302
    finally:
        for sock in held:
            sock.close()


@pytest.mark.parametrize("front", [{**HELD, "FRONT_MAX_UPLOADS_PER_USER": "1"}], indirect=True)
def test_a_user_has_their_most_uploads_in_flight_and_another_users_upload_is_taken(front, users):
    ann, bob = users
    held = _hold_upload(front, _token(ann))
    try:
        assert httpx.get(f"{front}/healthz", timeout=10).status_code == 200  # (its caller checked by now)

        again = _upload(front, _token(ann), 1)  # another token of hers: the same user

        assert again.status_code == 429, again.text
        assert "1 of your uploads" in again.json()["error"]
        assert _upload(front, _token(bob), 2).status_code == 201
    finally:
        held.close()


@pytest.mark.parametrize("front", [{**HELD, "FRONT_MAX_BODIES_IN_FLIGHT": "1"}], indirect=True)
def test_logins_do_not_wait_behind_uploads(front, users):
    held = _hold_upload(front, _token(users[0]))
    try:
        assert httpx.get(f"{front}/healthz", timeout=10).status_code == 200

        assert _upload(front, _token(users[1]), 1).status_code == 503  # every upload place is held ...
        assert _login(front).status_code == 302  # ... and a login has a place of its own
    finally:
        held.close()


@pytest.mark.parametrize(
    ("front", "kind"),
    [
        ({**HELD, "FRONT_SMALL_BODY_SECONDS": "2"}, "small"),
        ({**HELD, "FRONT_BODY_DEADLINE_SECONDS": "2"}, "upload"),
    ],
    indirect=["front"],
    ids=["small", "upload"],
)
def test_a_body_that_keeps_up_the_rate_is_cut_off_at_its_total_time(front, users, kind):
    if kind == "small":
        sock = _connect(front)
        sock.sendall(_head("/login/", 1000) + b"username=")
    else:
        sock = _hold_upload(front, _token(users[0]))
    with sock:
        answer = _answer(sock)

    assert answer.startswith(b"HTTP/1.1 408 "), answer
    assert b"the body did not arrive within 2 s" in answer


@pytest.mark.parametrize("front", [{**HELD, "FRONT_MAX_BODIES_PER_CLIENT": "1"}], indirect=True)
def test_a_body_gives_its_clients_place_back_however_it_ends(front, users):
    # One place for the address: each of these would lock it out if its place were never given back.
    token = _token(users[0])
    assert [_login(front).status_code for _ in range(2)] == [302, 302]  # answered
    assert [_upload(front, token, n).status_code for n in range(2)] == [201, 201]  # an uploader, checked
    with _connect(front) as refused:
        refused.sendall(_head("/login/", 1_000_000))
        assert _answer(refused).startswith(b"HTTP/1.1 413 ")  # refused
    with _connect(front) as unknown:
        unknown.sendall(_head("/v1/jobs", 1_000_000, "Authorization: Bearer fa_not-a-token"))
        assert _answer(unknown).startswith(b"HTTP/1.1 401 ")  # refused once checked
    with _connect(front) as gone:
        gone.sendall(_head("/login/", 1000) + b"username=")
        assert httpx.get(f"{front}/healthz", timeout=10).status_code == 200  # (its body begun)
    # ... and hung up on: its place is back once the front has seen it go.
    assert wait_for(lambda: _login(front).status_code == 302, 20, "the address's place was never given back")
