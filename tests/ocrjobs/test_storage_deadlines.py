"""Reads from the documents' storage on S3 (ocrjobs/storage.py) on the request path have a total
deadline and a size cap: a storage server that trickles or stalls is cut off at
STORAGE_READ_TIMEOUT_SECONDS of waiting, whatever phase it stalls in, and never sends more than
was asked for. The server here is a raw socket on loopback (tests/hostile.py) standing where the
S3 endpoint is configured; reads from a real one (rclone serve s3) are in test_storage.py."""

from __future__ import annotations

import os
import time

import pytest

from ocrjobs import storage
from ocrjobs.storage import StorageError, document_chunks, document_size
from tests import hostile
from tests.factories import PAGES_TRUTH, pdf_bytes
from tests.hostile import in_a_thread
from tests.ocrjobs.conftest import documents_on_s3
from tests.ocrjobs.helpers import submit

DEADLINE = 1.5
NAME = "documents/ab/source.pdf"


@pytest.fixture
def storage_at(hostile_peer, settings):
    """``storage_at(behaviour)``: the documents' storage pointed at a hostile peer as its S3 endpoint."""
    settings.STORAGE_READ_TIMEOUT_SECONDS = DEADLINE

    def point(behave) -> hostile.HostilePeer:
        server = hostile_peer(behave)
        # The operator's own endpoint may be loopback or private, as no user's URL may.
        settings.URL_FETCH_ALLOW_PRIVATE = False
        documents_on_s3(settings, {
            "STORAGE_S3_BUCKET": "documents", "STORAGE_S3_ENDPOINT_URL": server.url("").rstrip("/"),
            "AWS_ACCESS_KEY_ID": "key", "AWS_SECRET_ACCESS_KEY": "secret", "STORAGE_S3_REGION": "us-east-1",
            "STORAGE_S3_ADDRESSING_STYLE": "path",
        })  # fmt: skip
        return server

    return point


@pytest.mark.parametrize("behave", [hostile.trickled_headers, hostile.trickled_body, hostile.silent])
def test_a_storage_server_that_trickles_or_stalls_a_range_is_cut_off_at_the_total_deadline(storage_at, behave):
    server = storage_at(behave)

    [outcome] = in_a_thread(lambda: b"".join(document_chunks(NAME, 0, 1_000_000)))

    # The server would go on for ever (a byte every 0.5 s resets any per-read timeout): only the
    # total deadline can have ended it.
    assert isinstance(outcome, StorageError), outcome
    assert f"within {DEADLINE:g} s" in str(outcome) and NAME in str(outcome)
    assert server.sent < 1000
    assert server.requests[-1].startswith(f"GET /documents/{NAME}?".encode())  # a presigned GET
    assert server.header("Range") == "bytes=0-999999"


def test_a_storage_server_that_stalls_the_size_is_cut_off_at_the_total_deadline(storage_at):
    server = storage_at(hostile.silent)

    [outcome] = in_a_thread(lambda: document_size(NAME))

    assert isinstance(outcome, StorageError) and f"within {DEADLINE:g} s" in str(outcome), outcome
    assert server.requests[-1].startswith(b"HEAD ")


def test_more_bytes_than_were_asked_for_are_refused_as_they_stream(storage_at):
    storage_at(hostile.endless)  # a body without end, as fast as it is read

    [outcome] = in_a_thread(lambda: b"".join(document_chunks(NAME, 0, 1000)))

    assert isinstance(outcome, StorageError) and "larger than the limit of 1000 bytes" in str(outcome), outcome


def test_a_range_answered_from_the_first_byte_is_refused(storage_at):
    def whole(server, conn):  # a server that ignores Range
        server.send(conn, b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello")

    storage_at(whole)

    assert in_a_thread(lambda: document_size(NAME)) == [5]
    [outcome] = in_a_thread(lambda: b"".join(document_chunks(NAME, 2, 5)))

    assert isinstance(outcome, StorageError) and "answered 200" in str(outcome), outcome


def test_the_deadline_counts_the_servers_waits_not_the_time_a_reader_holds_a_chunk(storage_at, monkeypatch):
    monkeypatch.setattr(storage, "CHUNK", 64 * 1024)
    body = bytes(range(256)) * 1024  # 256 KiB: four chunks

    def prompt(server, conn):
        server.send(conn, b"HTTP/1.1 206 Partial Content\r\nContent-Length: %d\r\n\r\n" % len(body) + body)

    storage_at(prompt)
    got = []

    def slow_reader() -> None:
        for chunk in document_chunks(NAME, 0, len(body)):
            got.append(chunk)
            time.sleep(DEADLINE / 2)  # a slow browser: four chunks take longer than the deadline

    assert in_a_thread(slow_reader) == [None]
    assert b"".join(got) == body and [len(chunk) for chunk in got] == [64 * 1024] * 4


def test_the_viewer_answers_502_with_why_when_the_storage_does_not_answer_in_time(storage_at, client, ordinary_user):
    job = submit(ordinary_user, {"report.pdf": pdf_bytes(PAGES_TRUTH[:1])})  # stored before the storage stalls
    storage_at(hostile.silent)
    client.force_login(ordinary_user)

    answer = client.get(f"/jobs/{job.pk}/documents/{job.documents.get().pk}")

    assert answer.status_code == 502 and f"within {DEADLINE:g} s".encode() in answer.content


def test_a_real_s3_server_is_read_whole_from_an_offset_and_in_a_range_within_the_limits(s3):
    bucket, _ = s3
    data = os.urandom(3 * storage.CHUNK + 5)
    (bucket / NAME).parent.mkdir(parents=True)
    (bucket / NAME).write_bytes(data)

    assert document_size(NAME) == len(data)
    whole = list(document_chunks(NAME))
    assert b"".join(whole) == data and [len(chunk) for chunk in whole] == [storage.CHUNK] * 3 + [5]
    assert b"".join(document_chunks(NAME, 1000)) == data[1000:]
    assert b"".join(document_chunks(NAME, 10, 2010)) == data[10:2010]
