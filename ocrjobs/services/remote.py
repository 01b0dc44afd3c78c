"""An exchange with a machine we do not control (a webhook receiver, a document's URL host): every
address its name resolves to is checked, the connection is pinned to the checked address, and
the whole exchange has a total deadline and a size cap (invariant 17, review H1 and H2).

The deadline is wall-clock, over DNS, connect, TLS, the request, the response headers and the
body, and is enforced outside httpx's read loop: httpx's timeouts limit each read, so a host that
sends one byte a second never trips them. Here every socket operation goes through a network
backend (httpcore's public ``network_backend`` hook, the layer httpx itself sends through) that
first checks the deadline, then gives the operation no longer than what is left of it, so a
trickle ends at the deadline whichever phase it trickles in. DNS has no timeout of its own in the
standard library: the lookup runs on a thread of its own and is waited on until the deadline.

Bodies are never decompressed: ``Accept-Encoding: identity`` is sent, and a body that comes
compressed anyway is refused when it is read (a few KiB of brotli decode to gigabytes, review
H1); a webhook, which reads only the status, never reads one. The body is counted as it streams
and refused past its cap.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import httpcore
import httpx

from fleetadmin.errors import Invalid, RemoteFailed, TooLarge
from ocrjobs.services.urls import address_allowed, check_url

# Each phase's own limit, and never more than what is left of the total.
CONNECT_SECONDS = 10.0
READ_SECONDS = 30.0


class DeadlinePassed(Exception):
    """The exchange's total time is up."""


class Deadline:
    """A total time for an exchange, shared by its phases (and by the redirects of a download)."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.at = time.monotonic() + seconds
        self.cut = False  # the last operation was given what was left, not its phase's limit

    def extend(self, seconds: float) -> None:
        """Give back time the exchange spent not waiting on its peer (its reader held a chunk)."""
        self.at += seconds

    def left(self, phase: float | None = None) -> float:
        """Seconds an operation may take now: what is left, at most ``phase``; DeadlinePassed at 0."""
        left = self.at - time.monotonic()
        if left <= 0:
            raise DeadlinePassed
        self.cut = phase is None or left < phase
        return left if self.cut else phase


class _Stream(httpcore.NetworkStream):
    """A connection whose every operation is checked against the deadline first."""

    def __init__(self, stream: httpcore.NetworkStream, deadline: Deadline, progress: Callable[[], None] | None):
        self.stream, self.deadline, self.progress = stream, deadline, progress

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        data = self.stream.read(max_bytes, self.deadline.left(timeout))
        if self.progress is not None:
            self.progress()
        return data

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self.stream.write(buffer, self.deadline.left(timeout))

    def close(self) -> None:
        self.stream.close()

    def start_tls(self, ssl_context: ssl.SSLContext, server_hostname: str | None = None,
                  timeout: float | None = None) -> httpcore.NetworkStream:  # fmt: skip
        # The handshake as a whole is bounded by the socket's timeout (CPython's do_handshake
        # keeps one deadline across its reads), so a trickled handshake ends in time too.
        tls = self.stream.start_tls(ssl_context, server_hostname, self.deadline.left(timeout))
        return _Stream(tls, self.deadline, self.progress)

    def get_extra_info(self, info: str):
        return self.stream.get_extra_info(info)


class _Backend(httpcore.NetworkBackend):
    def __init__(self, deadline: Deadline, progress: Callable[[], None] | None):
        self.backend = httpcore.SyncBackend()
        self.deadline, self.progress = deadline, progress

    def connect_tcp(self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
                    socket_options=None) -> httpcore.NetworkStream:  # fmt: skip
        stream = self.backend.connect_tcp(host, port, self.deadline.left(timeout), local_address, socket_options)
        return _Stream(stream, self.deadline, self.progress)

    def connect_unix_socket(self, path: str, timeout: float | None = None, socket_options=None):
        raise Invalid("no unix sockets")

    def sleep(self, seconds: float) -> None:
        time.sleep(min(seconds, self.deadline.left()))


def resolve(url: str, deadline: Deadline, *, any_address: bool = False) -> list[str]:
    """The addresses ``url``'s host resolves to, each of them allowed (public, unless
    URL_FETCH_ALLOW_PRIVATE or ``any_address``), looked up within the deadline."""
    if not any_address:
        check_url(url)
    parts = urllib.parse.urlsplit(url)
    answer: dict = {}
    done = threading.Event()

    def lookup() -> None:
        try:
            answer["infos"] = socket.getaddrinfo(parts.hostname, parts.port or None)
        except OSError as exc:
            answer["error"] = exc
        finally:
            done.set()

    # A daemon thread: a resolver that never answers is left behind, not waited on.
    threading.Thread(target=lookup, name="resolve", daemon=True).start()
    if not done.wait(deadline.left()):
        raise DeadlinePassed
    if "error" in answer:
        reason = getattr(answer["error"], "strerror", None) or answer["error"]
        raise RemoteFailed(f"{parts.hostname}: the name does not resolve ({reason})")
    addresses = [info[4][0] for info in answer["infos"]]
    if not addresses or not (any_address or all(address_allowed(address) for address in addresses)):
        raise Invalid(f"{parts.hostname}: resolves to a private or loopback address; refused")
    return addresses


def pinned(url: str, address: str) -> tuple[httpx.URL, dict]:
    """The request for ``url`` sent to the address that was checked, so that a name which resolves
    differently the second time (DNS rebinding) cannot lead the request to a private address.
    The name still goes in the Host header and, for https, in the TLS handshake (SNI), where the
    certificate is checked against it."""
    original = httpx.URL(url)
    default_port = {"http": 80, "https": 443}[original.scheme]
    host = original.host if original.port in (None, default_port) else f"{original.host}:{original.port}"
    extensions = {"sni_hostname": original.host} if original.scheme == "https" else {}
    return original.copy_with(host=address), {"headers": {"Host": host}, "extensions": extensions}


def shown(url: str) -> str:
    """A URL as errors and logs show it: no credentials, query or fragment (a presigned URL's
    query is a credential, review L11), at most 100 characters."""
    parts = urllib.parse.urlsplit(url)
    try:
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        port = ""
    return f"{parts.scheme}://{parts.hostname or ''}{port}{parts.path}"[:100]


@dataclass
class Answer:
    status: int
    headers: dict[str, str]  # lower-case names; a repeated header keeps its last value
    chunks: Iterator[bytes]  # the body, raw, capped, within the deadline

    def header(self, name: str) -> str:
        return self.headers.get(name.lower(), "")


@contextlib.contextmanager
def exchange(method: str, url: str, *, deadline: Deadline, max_bytes: int, headers: dict[str, str] | None = None,
             content: bytes = b"", progress: Callable[[], None] | None = None,
             any_address: bool = False) -> Iterator[Answer]:  # fmt: skip
    """Send one request to ``url`` (checked, resolved, pinned; redirects are the caller's) and
    yield its answer once the headers are in. ``progress`` is called after every read from the
    network (headers and body): a caller renews its lease there. ``any_address``: a server the
    operator configured (the documents' storage, ocrjobs/storage.py), not one a user named, may
    be private or loopback; its deadline and size cap hold the same. Every failure, the
    deadline's included, is a domain error that says what happened
    (RemoteFailed; TooLarge past the cap)."""
    what = shown(url)
    try:
        target, pinning = pinned(url, resolve(url, deadline, any_address=any_address)[0])
        sent = {"Accept-Encoding": "identity", **(headers or {}), **pinning["headers"]}
        extensions = {
            **pinning["extensions"],
            "timeout": {"connect": CONNECT_SECONDS, "read": READ_SECONDS, "write": READ_SECONDS, "pool": READ_SECONDS},
        }
        backend = _Backend(deadline, progress)
        # httpx's context: certifi, or SSL_CERT_FILE/SSL_CERT_DIR when set, as an httpx.Client trusts.
        with (
            httpcore.ConnectionPool(ssl_context=httpx.create_ssl_context(), network_backend=backend, retries=0) as pool,
            pool.stream(
                method, str(target), headers=list(sent.items()), content=content or None, extensions=extensions
            ) as response,  # fmt: skip
        ):
            headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in response.headers}
            chunks = _capped(response.iter_stream(), deadline, max_bytes, what, headers.get("content-encoding", ""))
            yield Answer(status=response.status, headers=headers, chunks=chunks)
    except DeadlinePassed:
        raise RemoteFailed(f"{what}: no complete answer within {deadline.seconds:g} s") from None
    except httpcore.TimeoutException as exc:
        if deadline.cut:  # the operation timed out at the total deadline, not its own limit
            raise RemoteFailed(f"{what}: no complete answer within {deadline.seconds:g} s") from None
        raise RemoteFailed(f"{what}: timed out ({exc.__class__.__name__})") from None
    except (httpcore.NetworkError, httpcore.ProtocolError, httpcore.UnsupportedProtocol, ssl.SSLError) as exc:
        raise RemoteFailed(f"{what}: the connection failed ({exc.__class__.__name__}: {exc})") from None


def _capped(chunks: Iterator[bytes], deadline: Deadline, max_bytes: int, what: str,
            encoding: str) -> Iterator[bytes]:  # fmt: skip
    """The body as it comes, never decoded: a compressed one is refused before its first byte is read."""
    encoding = encoding.strip().lower()
    if encoding not in ("", "identity"):
        raise RemoteFailed(f"{what}: the server answered Content-Encoding: {encoding[:40]}, which was not asked for")
    size = 0
    for chunk in chunks:
        deadline.left()
        size += len(chunk)
        if size > max_bytes:
            raise TooLarge(f"{what}: the answer is larger than the limit of {max_bytes} bytes")
        yield chunk
