"""Pages' requests to pods: keep-alive HTTP/1.1 (plain or over TLS) on asyncio's own transports.

Every page is one small ``POST /v1/ocr`` and one small JSON answer. Through aiohttp each took about
130 µs of the dispatch loop's CPU on this machine (request and response objects, a task to write
the body, a timer, header multidicts: ~45% of the loop's CPU at zero-latency pods); written as one
``transport.write`` of prebuilt bytes and read by a small parser, about 35 µs (the same POSTs to the
same aiohttp server, 30,000 at 128 in flight). Pods behind TLS (RunPod's proxy, the default way to
reach a RunPod pod) go this way too, on asyncio's TLS transport with a verifying context; documents'
PUTs stay on aiohttp.

Errors are those the dispatcher tells apart: ``PodRefused`` (no connection: nothing reached the
pod; a TLS handshake or certificate that fails is one too, as aiohttp's ClientConnectorSSLError and
ClientConnectorCertificateError are ClientConnectorErrors), ``PodDisconnected`` (the connection broke
once the request may have gone out), TimeoutError.
"""

from __future__ import annotations

import asyncio
import re
import ssl
from urllib.parse import urlsplit

# An idle connection kept per pod for each lane that used it; more are closed when given back.
MAX_IDLE_PER_POD = 256
# An idle connection older than this is closed, not reused (aiohttp's keepalive_timeout, which the
# pages' POSTs had before): a pod's server or a proxy drops idle connections after its own timeout,
# and a page written as it does so fails as PodDisconnected, a fault of the pod.
IDLE_SECONDS = 15.0
MAX_HEAD_BYTES = 64 * 1024
DEFAULT_PORTS = {"http": 80, "https": 443}
_BREAKS_A_LINE = re.compile(r"[\r\n\0]")
_BREAKS_A_HEAD = re.compile(r"[\r\n\0 ]")  # the request line's path, the token: one word each


class PodRefused(ConnectionError):
    """No connection could be made to the pod: the request never reached it."""


class PodDisconnected(ConnectionError):
    """The connection broke (or the answer was not HTTP) after the request may have reached the pod."""


class _Connection(asyncio.Protocol):
    """One keep-alive connection; one request on it at a time."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.answer: asyncio.Future | None = None
        self.closed = False
        self.reusable = True
        self.idle_since = 0.0  # the loop's time it was last given back
        self._head: tuple[int, int, bool] | None = None  # (status, body length or -1 chunked, reusable)

    def connection_made(self, transport) -> None:
        self.transport = transport

    def connection_lost(self, exc) -> None:
        self.closed = True
        if self.answer is not None and not self.answer.done():
            self.answer.set_exception(PodDisconnected(f"the pod closed the connection: {exc!r}"))

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if self.answer is None or self.answer.done():
            # Bytes nobody asked for (also once the answer is whole, before its POST resumes and
            # gives the connection back): the next request would take them for its answer.
            self.reusable = False
            return
        try:
            answer = self._parse()
        except PodDisconnected as exc:
            self.reusable = False
            self.answer.set_exception(exc)
            return
        if answer is not None:
            self.answer.set_result(answer)

    def _parse(self) -> tuple[int, bytes] | None:
        if self._head is None:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                if len(self.buffer) > MAX_HEAD_BYTES:
                    raise PodDisconnected("the pod's answer has no end of headers")
                return None
            self._head = _parse_head(bytes(self.buffer[:end]))
            del self.buffer[: end + 4]
        status, length, reusable = self._head
        if 100 <= status < 200 and status != 101:  # an interim answer (no body): the real one follows
            self._head = None
            return self._parse()
        if length == -1:
            body = _dechunk(self.buffer)
            if body is None:
                return None
        else:
            if len(self.buffer) < length:
                return None
            body = bytes(self.buffer[:length])
            del self.buffer[:length]
        self._head = None
        if self.buffer:
            reusable = False
        self.reusable = self.reusable and reusable
        return status, body


def _parse_head(head: bytes) -> tuple[int, int, bool]:
    lines = head.split(b"\r\n")
    parts = lines[0].split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
        raise PodDisconnected(f"not an HTTP answer: {lines[0][:80]!r}")
    status = int(parts[1])
    length, chunked, reusable = None, False, parts[0] == b"HTTP/1.1"
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == b"content-length":
            # Digits only (int() takes "-1", "+2", "1_0"; -1 meant chunked below), and one length:
            # two that differ leave the answer's end unknown (RFC 9112 6.3).
            value = value.strip()
            if not value.isdigit() or (length is not None and int(value) != length):
                raise PodDisconnected(f"a bad Content-Length: {value[:40]!r}")
            length = int(value)
        elif name == b"transfer-encoding":
            chunked = b"chunked" in value.lower()
        elif name == b"connection":
            tokens = {token.strip() for token in value.lower().split(b",")}
            reusable = b"close" not in tokens and (reusable or b"keep-alive" in tokens)
    if status < 200 or status in (204, 304):
        # Never a body, whatever Content-Length says (RFC 9112 6.3); after a 101 no more HTTP.
        return status, 0, reusable and status != 101
    if chunked:
        return status, -1, reusable
    if length is None:
        raise PodDisconnected("an answer without Content-Length")  # read-to-close bodies: not from pods
    return status, length, reusable


def _dechunk(buffer: bytearray) -> bytes | None:
    """The whole body of a chunked answer taken off ``buffer``, or None while it is incomplete."""
    body = bytearray()
    at = 0
    while True:
        end = buffer.find(b"\r\n", at)
        if end < 0:
            return None
        try:
            size = int(bytes(buffer[at:end]).split(b";")[0], 16)
        except ValueError:
            raise PodDisconnected("a bad chunk") from None
        start = end + 2
        if size == 0:
            trailer = buffer.find(b"\r\n\r\n", end)
            if trailer < 0:
                return None
            del buffer[: trailer + 4]
            return bytes(body)
        if len(buffer) < start + size + 2:
            return None
        body += buffer[start : start + size]
        at = start + size + 2


class PodClient:
    """Keep-alive connections to pods over HTTP or HTTPS, for many requests in flight at once. A
    request that ends other than with a whole answer (a timeout, an error) closes its connection.

    ``ssl_context`` checks the pods' certificates; by default ``ssl.create_default_context()`` (the
    system's CAs, certificate and hostname checked), made once here, not per connection."""

    def __init__(self, *, timeout: float, connect_timeout: float, ssl_context: ssl.SSLContext | None = None) -> None:
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self.ssl_context = ssl_context if ssl_context is not None else ssl.create_default_context()
        # Idle connections by (scheme, host, port): a pod's TLS connection never serves a plain request.
        self._idle: dict[tuple[str, str, int], list[_Connection]] = {}
        self._prefixes: dict[tuple[str, str, str], bytes] = {}
        self._closed = False

    async def post(self, base_url: str, path: str, body: bytes, *, token: str = "",
                   content_type: str = "application/json") -> tuple[int, bytes]:  # fmt: skip
        """POST ``body`` to ``base_url + path`` (an ``http://`` or ``https://`` URL); (status, body)."""
        url = urlsplit(base_url)
        if url.scheme not in DEFAULT_PORTS or not url.hostname:
            raise ValueError(f"not an HTTP or HTTPS URL: {base_url}")
        address = (url.scheme, url.hostname, url.port or DEFAULT_PORTS[url.scheme])
        key = (base_url, path, token)
        prefix = self._prefixes.get(key)
        if prefix is None:
            target = (url.path.rstrip("/") + path) or "/"
            # The head is written by hand: nothing may end a line early (aiohttp refused it too), and
            # the Host is the pod's address, never credentials written into its URL.
            if _BREAKS_A_HEAD.search(target + token) or _BREAKS_A_LINE.search(content_type):
                raise ValueError(f"a line break, NUL or space in the request's path or token ({base_url}{path})")
            host = url.hostname if url.port is None else f"{url.hostname}:{url.port}"
            if ":" in url.hostname:  # an IPv6 address
                host = f"[{url.hostname}]" if url.port is None else f"[{url.hostname}]:{url.port}"
            auth = f"Authorization: Bearer {token}\r\n" if token else ""
            prefix = self._prefixes[key] = (
                f"POST {target} HTTP/1.1\r\nHost: {host}\r\n{auth}Content-Type: {content_type}\r\n"
                f"Accept: */*\r\nContent-Length: "
            ).encode("latin-1")
        request = b"%s%d\r\n\r\n%s" % (prefix, len(body), body)
        async with asyncio.timeout(self.timeout):
            connection = await self._connection(address)
            loop = asyncio.get_running_loop()
            connection.answer = loop.create_future()
            try:
                connection.transport.write(request)
                answer = await connection.answer
            except BaseException:
                connection.reusable = False
                self._give_back(address, connection)
                raise
            connection.answer = None
            self._give_back(address, connection)
            return answer

    async def _connection(self, address: tuple[str, str, int]) -> _Connection:
        idle = self._idle.get(address)
        fresh = asyncio.get_running_loop().time() - IDLE_SECONDS
        while idle:
            connection = idle.pop()
            if (
                not connection.closed
                and connection.reusable
                and not connection.transport.is_closing()
                and connection.idle_since >= fresh
            ):
                return connection
            connection.transport.close()
        scheme, host, port = address
        tls = {"ssl": self.ssl_context, "server_hostname": host} if scheme == "https" else {}
        loop = asyncio.get_running_loop()
        try:
            # The TLS handshake is part of connecting: within connect_timeout, and a failed one
            # (ssl.SSLError, SSLCertVerificationError: OSErrors) means nothing reached the pod.
            async with asyncio.timeout(self.connect_timeout):
                _, connection = await loop.create_connection(_Connection, host, port, **tls)
        except OSError as exc:
            raise PodRefused(f"cannot connect to {scheme}://{host}:{port}: {exc!r}") from exc
        return connection

    def _give_back(self, address: tuple[str, str, int], connection: _Connection) -> None:
        idle = self._idle.setdefault(address, [])
        # Closed: a request in flight at close() ends with its connection, not idle and open for good.
        if self._closed or connection.closed or not connection.reusable or len(idle) >= MAX_IDLE_PER_POD:
            connection.transport.close()
            return
        connection.idle_since = asyncio.get_running_loop().time()
        idle.append(connection)

    def close(self) -> None:
        self._closed = True
        for idle in self._idle.values():
            for connection in idle:
                connection.transport.close()
        self._idle.clear()
