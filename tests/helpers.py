"""Small helpers the tests of several packages share (requests, responses). Fixtures live in the
nearest conftest.py; helpers of one package in its own helpers.py (tests/ocrjobs/helpers.py,
tests/pods/helpers.py, tests/podserver/helpers.py)."""

from __future__ import annotations

import html


def auth(token: str) -> dict[str, str]:
    """The headers of a request that carries ``token`` (an API token, a pod's token)."""
    return {"Authorization": f"Bearer {token}"}


def page_text(response) -> str:
    """A rendered page's HTML as text to search, its entities decoded."""
    return html.unescape(response.content.decode())
