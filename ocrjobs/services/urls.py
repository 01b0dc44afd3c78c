"""URLs of documents and of webhooks: the form a URL must have (checked by the front, which never
resolves or fetches), whether an address is public (checked by the worker that connects, on every
address a name resolves to)."""

from __future__ import annotations

import ipaddress
import urllib.parse

from django.conf import settings

from fleetadmin.api import ApiError


def address_allowed(address: str) -> bool:
    if settings.URL_FETCH_ALLOW_PRIVATE:
        return True
    ip = ipaddress.ip_address(address)
    return ip.is_global and not ip.is_multicast


def check_url(url: str) -> str:
    """What can be checked without the network (the front never resolves or fetches):
    http(s) only, a host, no literal private or loopback address."""
    url = url.strip()
    if len(url) > 2000:
        raise ApiError("a URL is longer than 2,000 characters")
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise ApiError(f"{url[:100]}: only http and https URLs can be fetched")
    host = parts.hostname
    if not host:
        raise ApiError(f"{url[:100]}: the URL has no host")
    try:
        parts.port  # noqa: B018 (raises on a bad port)
    except ValueError:
        raise ApiError(f"{url[:100]}: the port is not a number") from None
    if settings.URL_FETCH_ALLOW_PRIVATE:
        return url
    if host == "localhost" or host.endswith((".localhost", ".local", ".internal")):
        raise ApiError(f"{url[:100]}: private and loopback addresses are refused")
    try:
        literal = ipaddress.ip_address(host)
    except ValueError:
        return url  # a name: resolved and checked by the worker that fetches it
    if not address_allowed(str(literal)):
        raise ApiError(f"{url[:100]}: private and loopback addresses are refused")
    return url
