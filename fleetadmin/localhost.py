"""Names under ``.localhost`` are the loopback address (RFC 6761, section 6.3), for the clients that
talk to pods: the dispatcher's aiohttp session (``LocalhostResolver``) and the boot's health checks
(``localhost_transport``, httpx).

RFC 6761 reserves ``localhost.`` and every name under it for loopback and says that resolvers
should answer them so without asking DNS; curl and browsers do. The C library does not (glibc reads
/etc/hosts, which names ``localhost`` alone), so ``abc-8000.proxy.localhost`` resolves nowhere on a
host without systemd-resolved. Pods reached through the RunPod simulator have such names
(``http://{pod_id}-{port}.proxy.localhost:PORT``, one host per pod as RunPod's proxy gives
``{pod_id}-{port}.proxy.runpod.net``); any other name resolves as before.
"""

from __future__ import annotations

import socket

import httpx
from aiohttp import DefaultResolver
from aiohttp.abc import AbstractResolver, ResolveResult

LOOPBACK_V4 = "127.0.0.1"
LOOPBACK_V6 = "::1"


def is_localhost_name(host: str | None) -> bool:
    """Whether ``host`` (a name, no port) is ``localhost`` or a name under it."""
    if not host:
        return False
    name = host.rstrip(".").lower()
    return name == "localhost" or name.endswith(".localhost")


def _answers(host: str, port: int, family: int) -> list[ResolveResult]:
    addresses = {
        socket.AF_INET: [(LOOPBACK_V4, socket.AF_INET)],
        socket.AF_INET6: [(LOOPBACK_V6, socket.AF_INET6)],
    }.get(family, [(LOOPBACK_V4, socket.AF_INET), (LOOPBACK_V6, socket.AF_INET6)])
    return [
        ResolveResult(hostname=host, host=address, port=port, family=kind, proto=0, flags=socket.AI_NUMERICHOST)
        for address, kind in addresses
    ]


class LocalhostResolver(AbstractResolver):
    """aiohttp's resolver (its public interface) that answers names under ``.localhost`` with the
    loopback addresses, IPv4 first, and asks aiohttp's default resolver for every other name."""

    def __init__(self) -> None:
        self._names = DefaultResolver()

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        if is_localhost_name(host):
            return _answers(host, port, family)
        return await self._names.resolve(host, port, family)

    async def close(self) -> None:
        await self._names.close()


class _LocalhostNames(httpx.BaseTransport):
    """Requests to a name under ``.localhost`` go to the loopback address, the name kept in the Host
    header (and, over TLS, in the handshake, where the certificate is checked against it)."""

    def __init__(self, transport: httpx.BaseTransport) -> None:
        self._transport = transport

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        if is_localhost_name(url.host):
            extensions = dict(request.extensions)
            if url.scheme == "https":
                extensions.setdefault("sni_hostname", url.host)
            # The Host header was set from the name when the request was built: it stays.
            request = httpx.Request(request.method, url.copy_with(host=LOOPBACK_V4), headers=request.headers,
                                    stream=request.stream, extensions=extensions)  # fmt: skip
        return self._transport.handle_request(request)

    def close(self) -> None:
        self._transport.close()


def localhost_transport(**options) -> httpx.BaseTransport:
    """An httpx transport (``httpx.HTTPTransport(**options)``) that sends requests to names under
    ``.localhost`` to the loopback address."""
    return _LocalhostNames(httpx.HTTPTransport(**options))
