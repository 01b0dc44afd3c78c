"""URLs of documents and of webhooks: the form a URL must have (checked by the front, which never
resolves or fetches), whether an address is public (checked by the worker that connects, on every
address a name resolves to)."""

from __future__ import annotations

import ipaddress
import urllib.parse

from django.conf import settings

from fleetadmin.errors import Invalid

# IPv6 prefixes that carry an IPv4 address a gateway translates to, which ``is_global`` calls
# public whatever IPv4 address they hold: NAT64's well-known prefix (RFC 6052), whose /96 holds
# the address in its last 32 bits; the local-use prefix (RFC 8215) and the deprecated
# IPv4-compatible form (::a.b.c.d), refused outright: a /48 carries its IPv4 address in any of
# RFC 6052's layouts (review N7: 64:ff9b:1:a00:0:500:808:808 holds 10.0.0.5), and a local
# translator is ours to reach, never a document host's.
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_REFUSED_V6 = (ipaddress.ip_network("64:ff9b:1::/48"), ipaddress.ip_network("::/96"))


def _embedded_ipv4(ip: ipaddress.IPv6Address) -> list[ipaddress.IPv4Address]:
    """The IPv4 addresses an IPv6 address carries (mapped, 6to4, Teredo, NAT64, compatible)."""
    embedded = [ip.ipv4_mapped, ip.sixtofour, *(ip.teredo or ())]
    if ip in _NAT64:
        embedded.append(ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF))
    return [address for address in embedded if address is not None]


def address_allowed(address: str) -> bool:
    """Whether an address a URL resolved to may be connected to: public and not multicast, and so
    is every IPv4 address it carries (review M10: a NAT64 gateway turns 64:ff9b::a00:5 into
    10.0.0.5)."""
    if settings.URL_FETCH_ALLOW_PRIVATE:
        return True
    ip = ipaddress.ip_address(address)
    if not ip.is_global or ip.is_multicast:
        return False
    if isinstance(ip, ipaddress.IPv6Address):
        if any(ip in network for network in _REFUSED_V6):
            return False
        return all(inner.is_global and not inner.is_multicast for inner in _embedded_ipv4(ip))
    return True


def check_url(url: str) -> str:
    """What can be checked without the network (the front never resolves or fetches):
    http(s) only, a host, no literal private or loopback address."""
    url = url.strip()
    if len(url) > 2000:
        raise Invalid("a URL is longer than 2,000 characters")
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise Invalid(f"{url[:100]}: only http and https URLs can be fetched")
    host = parts.hostname
    if not host:
        raise Invalid(f"{url[:100]}: the URL has no host")
    try:
        parts.port  # noqa: B018 (raises on a bad port)
    except ValueError:
        raise Invalid(f"{url[:100]}: the port is not a number") from None
    if settings.URL_FETCH_ALLOW_PRIVATE:
        return url
    if host == "localhost" or host.endswith((".localhost", ".local", ".internal")):
        raise Invalid(f"{url[:100]}: private and loopback addresses are refused")
    try:
        literal = ipaddress.ip_address(host)
    except ValueError:
        return url  # a name: resolved and checked by the worker that fetches it
    if not address_allowed(str(literal)):
        raise Invalid(f"{url[:100]}: private and loopback addresses are refused")
    return url
