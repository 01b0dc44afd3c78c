"""Which addresses a URL document or a webhook may connect to (ocrjobs/services/urls.py): public
ones only, including the IPv4 address an IPv6 address carries to a gateway (review M10)."""

from __future__ import annotations

import pytest

from ocrjobs.services.urls import address_allowed


@pytest.mark.parametrize(
    "address",
    [
        "64:ff9b::a9fe:a9fe",  # NAT64 of 169.254.169.254, the cloud metadata service
        "64:ff9b::a00:1",  # NAT64 of 10.0.0.1
        "64:ff9b:1::a00:5",  # local-use NAT64 prefix, 10.0.0.5
        "64:ff9b:1:a00:0:500:808:808",  # the same, 10.0.0.5 in RFC 6052's /48 layout (review N7)
        "64:ff9b:1::808:808",  # the local-use prefix is never a document host's, whatever it carries
        "2002:a9fe:a9fe::1",  # 6to4 of 169.254.169.254
        "2001:0:4136:e378:8000:63bf:f5ff:fffe",  # Teredo whose client is 10.0.0.1
        "::127.0.0.1",  # IPv4-compatible loopback
        "::8.8.8.8",  # IPv4-compatible: deprecated, refused whatever it holds
        "::ffff:127.0.0.1",  # IPv4-mapped loopback
        "10.1.2.3",
        "127.0.0.1",
        "169.254.169.254",
        "::1",
        "fd00::1",
        "224.0.0.1",
        "0.0.0.0",
    ],
)
def test_an_address_that_is_or_carries_a_private_one_is_refused(settings, address):
    settings.URL_FETCH_ALLOW_PRIVATE = False

    assert not address_allowed(address)


@pytest.mark.parametrize("address", ["8.8.8.8", "2606:4700:4700::1111", "64:ff9b::808:808", "2002:808:808::1"])
def test_a_public_address_and_one_that_carries_a_public_one_are_allowed(settings, address):
    settings.URL_FETCH_ALLOW_PRIVATE = False

    assert address_allowed(address)
