"""A hostile HTTP peer on loopback, for the trust-boundary tests (invariant 17): a raw socket
server on a thread of its own whose answer to each connection is a behaviour below. It keeps the
requests it got, and how many bytes of its answer it managed to send."""

from __future__ import annotations

import gzip
import itertools
import socket
import threading
from collections.abc import Callable, Iterable

TRICKLE_SECONDS = 0.5


class HostilePeer:
    def __init__(self, behave: Callable[[HostilePeer, socket.socket], None]):
        self.behave = behave
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.2)
        self.port = self.listener.getsockname()[1]
        self.stop = threading.Event()
        self.requests: list[bytes] = []
        self.sent = 0
        self.connected = threading.Event()
        self.threads = [threading.Thread(target=self._accept, daemon=True)]
        self.threads[0].start()

    def url(self, path: str = "/") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def close(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(10)
        self.listener.close()

    def _accept(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            thread = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            self.threads.append(thread)
            thread.start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(5)
            try:
                request = b""
                while b"\r\n\r\n" not in request:
                    data = conn.recv(65536)
                    if not data:
                        return
                    request += data
                head, _, body = request.partition(b"\r\n\r\n")
                length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)  # fmt: skip
                while len(body) < length:
                    body += conn.recv(65536)
                self.requests.append(head + b"\r\n\r\n" + body)
                self.connected.set()
                self.behave(self, conn)
            except OSError:
                return  # the client gave up, as it should

    def send(self, conn: socket.socket, data: bytes) -> None:
        conn.sendall(data)
        self.sent += len(data)

    def trickle(self, conn: socket.socket, data: Iterable[int]) -> None:
        """One byte every TRICKLE_SECONDS, until the client hangs up or the test ends."""
        for byte in data:
            if self.stop.wait(TRICKLE_SECONDS):
                return
            self.send(conn, bytes([byte]))

    def header(self, name: str) -> str | None:
        """A header of the last request."""
        for line in self.requests[-1].split(b"\r\n\r\n")[0].split(b"\r\n")[1:]:
            key, _, value = line.decode("latin-1").partition(":")
            if key.strip().lower() == name.lower():
                return value.strip()
        return None


def trickled_headers(peer: HostilePeer, conn: socket.socket) -> None:
    """A status line and a header that never end."""
    peer.trickle(conn, itertools.chain(b"HTTP/1.1 200 OK\r\nX-Pad: ", itertools.repeat(ord("a"))))


def trickled_body(peer: HostilePeer, conn: socket.socket) -> None:
    """Headers at once (a 200 of a megabyte), then the body a byte at a time."""
    peer.send(conn, b"HTTP/1.1 200 OK\r\nContent-Type: application/pdf\r\nContent-Length: 1000000\r\n\r\n")
    peer.trickle(conn, itertools.chain(b"%PDF-1.7\n", itertools.repeat(ord(" "))))


def silent(peer: HostilePeer, conn: socket.socket) -> None:
    """Takes the request and answers nothing."""
    peer.stop.wait()


ZEROS = 32 * 1024 * 1024


def bomb(encoding: str) -> Callable[[HostilePeer, socket.socket], None]:
    """A 200 whose body is ZEROS bytes of zeros, compressed (gzip: ~32 KiB; br: a few dozen bytes)."""
    if encoding == "br":
        import brotli

        payload = brotli.compress(bytes(ZEROS), quality=11)
    else:
        payload = gzip.compress(bytes(ZEROS), compresslevel=9)

    def answer(peer: HostilePeer, conn: socket.socket) -> None:
        peer.send(conn, b"HTTP/1.1 200 OK\r\nContent-Encoding: " + encoding.encode()
                  + b"\r\nContent-Length: " + str(len(payload)).encode() + b"\r\n\r\n" + payload)  # fmt: skip
        peer.stop.wait()

    answer.payload_bytes = len(payload)  # type: ignore[attr-defined]
    return answer


def endless(peer: HostilePeer, conn: socket.socket) -> None:
    """A 200 with no length, whose body never ends (as fast as the client reads it)."""
    peer.send(conn, b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n%PDF-1.7\n")
    chunk = b" " * 65536
    while not peer.stop.is_set():
        peer.send(conn, chunk)


def in_a_thread(call) -> list:
    """Run ``call`` on a thread and wait for it (no longer than a minute: a hang fails the test)."""
    outcome: list = []

    def run() -> None:
        try:
            outcome.append(call())
        except Exception as exc:  # the test reads it
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(60)
    assert not thread.is_alive(), "the exchange did not end at its deadline"
    return outcome
