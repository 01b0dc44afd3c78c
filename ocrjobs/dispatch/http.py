"""Pages' requests to pods (``POST /v1/ocr``), plain or over TLS, on the dispatcher's one aiohttp
session (which documents' PUTs share): its pooled keep-alive connections, its HTTP parser.

Every wait is bounded: a total deadline per page request, set from outside the read (a pod that
trickles its answer a byte at a time still ends at it), and a cap on the answer's bytes, read in
chunks and stopped at the cap (``POD_ANSWER_MAX_BYTES``), never held whole first. Answers are asked
for without compression and never decompressed here, so the cap counts the bytes that came.

Errors are those the dispatcher tells apart: ``PodRefused`` (no connection: nothing reached the pod;
a TLS handshake or certificate that fails is one too, and so is a connection not made within its
connect timeout), ``AnswerTooLarge``, aiohttp's ``ClientError`` (the connection broke, or the answer
was not HTTP, once the request may have reached the pod), TimeoutError.
"""

from __future__ import annotations

import asyncio
import ssl

import aiohttp
from yarl import URL

from fleetadmin.localhost import LocalhostResolver

# An idle connection older than this is closed, not reused: a pod's server or a proxy drops idle
# connections after its own timeout, and a page written as it does so fails as a fault of the pod.
IDLE_SECONDS = 15.0
CONNECT_SECONDS = 5.0
# Pages' POSTs: the deadline is PodPages's own, around the request and the read; aiohttp's total
# timer would be a second one per page.
_CONNECT_ONLY = aiohttp.ClientTimeout(total=None, sock_connect=CONNECT_SECONDS)


class PodRefused(ConnectionError):
    """No connection could be made to the pod: the request never reached it."""


class AnswerTooLarge(Exception):
    """The pod's answer was longer than the cap: read no further, the connection closed."""


def pod_session(*, deadline: float, ssl_context: ssl.SSLContext | None = None) -> aiohttp.ClientSession:
    """The dispatcher's one session to its pods: pooled keep-alive connections, certificates checked
    against ``ssl_context`` (None: the system's CAs, hostname checked too), a total deadline per
    request, bodies never decompressed, names under ``.localhost`` on loopback (RFC 6761)."""
    # No limit per host, nor in all: lanes bound what each pod is sent (lanes.py; a page holds its
    # lane from its document's PUT to its answer, and a PUT is sent only for a page holding one), and
    # pods may share a host (a deployment that reaches them through one gateway). aiohttp's
    # limit_per_host of 256 held 64 pods x 8 lanes behind one host to 256 requests out: achieved ÷
    # ideal 0.49 at 2 s a page, 0.96 without it (bench/dispatch.py --gateway, issue 37).
    connector = aiohttp.TCPConnector(
        limit=0,
        limit_per_host=0,
        resolver=LocalhostResolver(),
        ttl_dns_cache=300,
        keepalive_timeout=IDLE_SECONDS,
        ssl=ssl_context if ssl_context is not None else ssl.create_default_context(),
    )
    timeout = aiohttp.ClientTimeout(total=deadline, sock_connect=CONNECT_SECONDS)
    # What every request asks (documents' PUTs too), given once: headers passed with each request
    # were turned into a multidict and merged one by one, 4% of the loop's CPU at 64 pods x 8 lanes.
    headers = {"Accept": "*/*", "Accept-Encoding": "identity"}
    return aiohttp.ClientSession(timeout=timeout, connector=connector, auto_decompress=False, headers=headers)


class PodPages:
    """Pages' POSTs on ``session``: each ends within ``deadline`` seconds, its answer at most
    ``max_bytes`` long."""

    def __init__(self, session: aiohttp.ClientSession, *, deadline: float, max_bytes: int) -> None:
        self.session = session
        self.deadline = deadline
        self.max_bytes = max_bytes
        self._targets: dict[tuple[str, str], URL] = {}
        self._headers: dict[str, dict[str, str]] = {}

    async def post(self, base_url: str, path: str, body: bytes, *, token: str = "") -> tuple[int, bytes]:
        """POST ``body`` (JSON) to ``base_url + path``; the answer's (status, body)."""
        target = self._targets.get((base_url, path))
        if target is None:
            url = URL(base_url)
            if url.scheme not in ("http", "https") or not url.host:
                raise ValueError(f"not an HTTP or HTTPS URL: {base_url}")
            # Never credentials written into a pod's URL: the pod's token is its only authorization.
            url = url.with_user(None).with_password(None)
            target = self._targets[(base_url, path)] = url.with_path(url.path.rstrip("/") + path)
        headers = self._headers.get(token)
        if headers is None:
            headers = self._headers[token] = {"Authorization": f"Bearer {token}"} if token else {}
        # The body's type goes with it (a payload of bytes, not looked up in aiohttp's registry).
        payload = aiohttp.BytesPayload(body, content_type="application/json")
        async with asyncio.timeout(self.deadline):
            try:
                answer = await self.session.post(target, data=payload, headers=headers, timeout=_CONNECT_ONLY)
            except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as exc:
                raise PodRefused(f"cannot connect to {target.origin()}: {exc!r}") from exc
            try:
                return answer.status, await read_answer(answer, self.max_bytes)
            except BaseException:
                answer.close()  # the connection too: what is left of the answer is never read
                raise
            finally:
                answer.release()


async def read_answer(answer: aiohttp.ClientResponse, max_bytes: int) -> bytes:
    """``answer``'s body, read in chunks; AnswerTooLarge as soon as it is longer than ``max_bytes``
    (said by its Content-Length, or once that much has come), the rest never read."""
    length = answer.content_length
    if length is not None and length > max_bytes:
        raise AnswerTooLarge(f"the pod's answer is {length} bytes, over {max_bytes} (POD_ANSWER_MAX_BYTES)")
    read = bytearray()
    while chunk := await answer.content.readany():
        read += chunk
        if len(read) > max_bytes:
            raise AnswerTooLarge(f"the pod's answer is over {max_bytes} bytes (POD_ANSWER_MAX_BYTES)")
    return bytes(read)
