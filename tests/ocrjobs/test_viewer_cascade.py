"""The page viewer marks a cascade's escalated pages (issue 26): a chip on each, and every stage's
pool, engine and confidence (or why a stage gave no reading) on the page's view."""

from __future__ import annotations

import re

from ocrjobs.results import StoredResult
from ocrjobs.services.pages import PageResult, pages_claim, pages_complete
from ocrjobs.viewer import cascade_stages
from podserver.answers import PageAnswer
from tests.factories import image_bytes
from tests.ocrjobs.helpers import split, submit
from tests.ocrjobs.test_cascade import _read, reading

CHIP = '<span class="chip escalated">escalated</span>'


def _articles(html: str) -> dict[str, str]:
    """Each viewer page's HTML by its document's name."""
    found = re.findall(r'<article class="viewer-page.*?<h3>(\S+) · page \d+(.*?)</article>', html, re.S)
    return {name: body for name, body in found}


def test_escalated_pages_are_marked_with_both_stages(client, ordinary_user, cascade):
    cheap, strong = cascade
    job = submit(ordinary_user, {f"p{n}.png": image_bytes([f"page {n}"]) for n in range(3)}, pool_key=cheap.key)
    split(job)
    _read(cheap, [95, 30, 40], engine="tesseract")  # p1 and p2 escalate
    (first,) = pages_claim(pool_id=strong.pk, token="t", limit=1)  # p1 is read again; p2 still waits
    pages_complete(
        token="t", items=[PageResult(first.id, job.pk, first.position, None, PageAnswer(**reading("rapidocr", 88)))]
    )
    client.force_login(ordinary_user)

    html = client.get(f"/jobs/{job.pk}").content.decode()

    pages = _articles(html)
    assert set(pages) == {"p0.png", "p1.png", "p2.png"}
    assert CHIP not in pages["p0.png"] and "cascade:" not in pages["p0.png"]  # kept by the first pool
    assert CHIP in pages["p1.png"]
    assert re.search(r"cheap · tesseract · confidence 30\.0</span> → <span class=\"stage\">strong · rapidocr · "
                     r"confidence 88\.0", pages["p1.png"]), pages["p1.png"]  # fmt: skip
    assert CHIP in pages["p2.png"] and "pending" in pages["p2.png"]  # waits in the escalation pool


def test_a_stage_that_gave_no_reading_says_why():
    result = {"engine": "tesseract", "escalated": False, "cascade": [
        {"pool": "cheap", "engine": "tesseract", "confidence": 40.0, "seconds": 0.5},
        {"pool": "strong", "skipped": "the job's budget of $0.05 is spent ($0.0600)"},
    ]}  # fmt: skip
    assert cascade_stages(StoredResult.from_dict(result)) == [
        {"pool": "cheap", "engine": "tesseract", "confidence": 40.0, "unread": ""},
        {"pool": "strong", "engine": "", "confidence": None, "unread": "the job's budget of $0.05 is spent ($0.0600)"},
    ]
    assert cascade_stages(StoredResult.from_dict({"engine": "tesseract"})) == []
    assert cascade_stages(StoredResult.from_dict({"cascade": "junk"})) == []
