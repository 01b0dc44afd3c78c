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


def only_audit_entry(**lookup):
    """The one audit entry (pods.models.AuditEntry) that matches ``lookup``: an action recorded once."""
    from pods.models import AuditEntry  # (the models load once Django is set up)

    entries = list(AuditEntry.objects.filter(**lookup))
    assert len(entries) == 1, entries
    return entries[0]
