"""The pod's bearer token: every request but /healthz needs it, decided from the headers alone."""

from __future__ import annotations

import hashlib
import socket

import httpx
import pytest

from podserver.config import ConfigError
from tests.factories import pdf_bytes
from tests.helpers import auth

from .conftest import HANG_GUARD

# The pod server touches no database: once, on the SQLite run.
pytestmark = pytest.mark.once_sqlite

TOKEN = "pod-token-3f9a1c7e5b2d4086"


@pytest.fixture
def guarded(start_server) -> tuple[object, str]:
    return start_server(token=TOKEN)


@pytest.mark.parametrize(
    ("method", "path"),
    [("GET", "/v1/models"), ("POST", "/v1/ocr"), ("PUT", f"/v1/documents/{'a' * 64}"), ("GET", "/nope")],
)
@pytest.mark.parametrize(
    "headers",
    [
        {},
        auth("wrong"),
        auth(TOKEN[:-1]),
        auth(TOKEN + "x"),
        {"Authorization": TOKEN},
        {"Authorization": f"Basic {TOKEN}"},
    ],
    ids=["none", "wrong", "prefix", "longer", "no-scheme", "basic"],
)
def test_requests_without_the_right_token_are_401(guarded, method: str, path: str, headers: dict) -> None:
    _, url = guarded
    response = httpx.request(method, f"{url}{path}", headers=headers, content=b"x" * 100)
    assert response.status_code == 401
    assert response.json() == {"error": "missing or wrong token"}
    assert response.headers["www-authenticate"] == "Bearer"
    assert TOKEN not in response.text


def test_the_right_token_opens_every_route(guarded, page_png: bytes) -> None:
    _, url = guarded
    data = pdf_bytes([["Authorised page."]])
    name = hashlib.sha256(data).hexdigest()
    with httpx.Client(headers=auth(TOKEN), timeout=HANG_GUARD) as client:
        assert client.get(f"{url}/v1/models").json()["ready"] is True
        assert client.put(f"{url}/v1/documents/{name}", content=data).status_code == 201
        assert client.post(f"{url}/v1/ocr", json={"document": name, "page": 1}).status_code == 200
        assert client.post(f"{url}/v1/ocr", content=page_png).status_code == 200


def test_healthz_needs_no_token(guarded) -> None:
    _, url = guarded
    response = httpx.get(f"{url}/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


def test_a_wrong_token_is_refused_before_the_body_is_read(guarded) -> None:
    server, url = guarded
    host, port = url.removeprefix("http://").split(":")
    name = "b" * 64
    with socket.create_connection((host, int(port)), timeout=HANG_GUARD) as sock:
        sock.sendall(
            f"PUT /v1/documents/{name} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer wrong\r\n"
            "Content-Length: 100000000\r\nExpect: 100-continue\r\n\r\n".encode()
        )
        reply = b""
        while chunk := sock.recv(65536):  # the server closes: the connection is done
            reply += chunk
    assert reply.startswith(b"HTTP/1.1 401 ")
    assert b"100 Continue" not in reply
    assert b"Connection: close" in reply
    assert server.documents.stats()["count"] == 0


def test_a_server_on_a_public_address_refuses_to_start_without_a_token(start_server) -> None:
    with pytest.raises(ConfigError, match="without a token"):
        start_server(host="0.0.0.0")
