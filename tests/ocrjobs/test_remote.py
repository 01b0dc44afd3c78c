"""ocrjobs/services/remote.py: an exchange with a machine we do not control ends at its total
deadline whichever phase the peer stalls in, never decodes a compressed body, and caps the body."""

from __future__ import annotations

import threading

import pytest

from fleetadmin.errors import DomainError, TooLarge
from ocrjobs.services import remote
from tests import hostile
from tests.hostile import in_a_thread

DEADLINE = 1.5


def _get(url: str, *, max_bytes: int = 10_000_000, seconds: float = DEADLINE) -> tuple[int, bytes]:
    with remote.exchange("GET", url, deadline=remote.Deadline(seconds), max_bytes=max_bytes) as answer:
        return answer.status, b"".join(answer.chunks)


@pytest.mark.parametrize("behave", [hostile.trickled_headers, hostile.trickled_body, hostile.silent])
def test_a_peer_that_trickles_or_stalls_is_cut_off_at_the_total_deadline(hostile_peer, behave):
    server = hostile_peer(behave)

    [outcome] = in_a_thread(lambda: _get(server.url("/x.pdf")))

    # The peer would go on for ever (a byte every 0.5 s resets any per-read timeout): only the
    # total deadline can have ended it.
    assert isinstance(outcome, DomainError), outcome
    assert f"within {DEADLINE:g} s" in outcome.message
    assert server.sent < 1000


@pytest.mark.parametrize("encoding", ["gzip", "br"])
def test_a_compressed_bomb_is_refused_unread_and_identity_was_asked_for(hostile_peer, encoding):
    server = hostile_peer(hostile.bomb(encoding))

    [outcome] = in_a_thread(lambda: _get(server.url("/x.pdf")))

    assert isinstance(outcome, DomainError) and f"Content-Encoding: {encoding}" in outcome.message
    assert server.header("Accept-Encoding") == "identity"


def test_a_body_past_the_cap_is_refused_as_it_streams(hostile_peer):
    server = hostile_peer(hostile.endless)

    [outcome] = in_a_thread(lambda: _get(server.url("/x.pdf"), max_bytes=1_000_000, seconds=60))

    assert isinstance(outcome, TooLarge) and "1000000 bytes" in outcome.message


def test_an_answer_within_its_limits_comes_whole(hostile_peer):
    def answer(server, conn):
        server.send(conn, b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello")

    server = hostile_peer(answer)

    assert _get(server.url("/x")) == (200, b"hello")
    assert server.header("Accept-Encoding") == "identity"


def test_a_name_that_does_not_answer_in_time_ends_at_the_deadline(monkeypatch, settings):
    settings.URL_FETCH_ALLOW_PRIVATE = True
    release = threading.Event()

    def resolver_that_hangs(*args, **kwargs):
        release.wait(60)
        raise OSError("never answered")

    monkeypatch.setattr(remote.socket, "getaddrinfo", resolver_that_hangs)
    try:
        [outcome] = in_a_thread(lambda: _get("http://files.example.org/x.pdf", seconds=0.5))
    finally:
        release.set()

    assert isinstance(outcome, DomainError) and "within 0.5 s" in outcome.message


def test_an_error_never_shows_the_urls_credentials_or_query(hostile_peer):
    server = hostile_peer(hostile.silent)
    url = server.url("/x.pdf?X-Amz-Signature=s3cr3t").replace("http://", "http://user:pa55@")

    [outcome] = in_a_thread(lambda: _get(url, seconds=0.5))

    assert isinstance(outcome, DomainError) and f"127.0.0.1:{server.port}/x.pdf" in outcome.message
    assert "s3cr3t" not in outcome.message and "pa55" not in outcome.message
