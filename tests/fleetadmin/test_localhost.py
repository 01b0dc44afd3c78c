"""Names under .localhost are loopback (RFC 6761) for the clients that talk to pods
(fleetadmin/localhost.py): the answers the dispatcher's resolver gives, and the boot's httpx client
reaching a server on 127.0.0.1 by such a name, the name kept in the Host header."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from fleetadmin.localhost import LocalhostResolver, is_localhost_name, localhost_transport


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("localhost", True),
        ("abc123-8000.proxy.localhost", True),
        ("ABC123-8000.Proxy.LOCALHOST.", True),  # any case, a trailing dot
        ("localhost.example.com", False),
        ("notlocalhost", False),
        ("abc123-8000.proxy.runpod.net", False),
        ("127.0.0.1", False),
        ("", False),
        (None, False),
    ],
)
def test_localhost_and_names_under_it_are_loopback_no_other(host, loopback):
    assert is_localhost_name(host) is loopback


def test_the_dispatchers_resolver_answers_names_under_localhost_with_loopback_ipv4_first():
    async def scenario():
        resolver = LocalhostResolver()
        try:
            either = await resolver.resolve("abc123-8000.proxy.localhost", 41234, socket.AF_UNSPEC)
            v4 = await resolver.resolve("abc123-8000.proxy.localhost", 41234, socket.AF_INET)
            v6 = await resolver.resolve("abc123-8000.proxy.localhost", 41234, socket.AF_INET6)
            other = await resolver.resolve("127.0.0.2", 80, socket.AF_INET)  # asked of aiohttp's own resolver
        finally:
            await resolver.close()
        return either, v4, v6, other

    either, v4, v6, other = asyncio.run(scenario())
    assert [(a["host"], a["port"], a["family"]) for a in either] == [
        ("127.0.0.1", 41234, socket.AF_INET),
        ("::1", 41234, socket.AF_INET6),
    ]
    assert [a["host"] for a in v4] == ["127.0.0.1"] and [a["host"] for a in v6] == ["::1"]
    assert all(a["hostname"] == "abc123-8000.proxy.localhost" for a in either)
    assert [a["host"] for a in other] == ["127.0.0.2"]


@pytest.fixture
def server() -> Iterator[tuple[int, list[str]]]:
    """An HTTP server on 127.0.0.1 that answers every GET and records its Host header."""
    hosts: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            hosts.append(self.headers["Host"])
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield httpd.server_address[1], hosts
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_the_boots_client_reaches_a_name_under_localhost_on_loopback_the_name_in_the_host_header(server):
    port, hosts = server
    with httpx.Client(transport=localhost_transport(), timeout=10) as client:
        named = client.get(f"http://abc123-8000.proxy.localhost:{port}/healthz")
        numeric = client.get(f"http://127.0.0.1:{port}/healthz")

    assert (named.status_code, named.text, numeric.status_code) == (200, "ok", 200)
    assert hosts == [f"abc123-8000.proxy.localhost:{port}", f"127.0.0.1:{port}"]
