"""The pod's answers are the types in podserver/answers.py: what the server sends parses as them,
and a parsed page's answer dumped again is what was sent (what the dispatcher stores)."""

from __future__ import annotations

import hashlib
import json

import httpx
import pytest

from podserver.answers import DocumentStored, PageAnswer, PodError, PodModels
from tests.factories import pdf_bytes

from .conftest import HANG_GUARD

pytestmark = pytest.mark.once_sqlite


def test_a_pages_answer_parses_as_a_page_answer_and_dumps_back_to_what_was_sent(start_server) -> None:
    _, url = start_server()
    data = pdf_bytes([["Typed answers, parsed once."]])
    name = hashlib.sha256(data).hexdigest()
    with httpx.Client(timeout=HANG_GUARD) as client:
        stored = client.put(f"{url}/v1/documents/{name}", content=data)
        page = client.post(f"{url}/v1/ocr", json={"document": name, "page": 1, "dpi": 150})
        models = client.get(f"{url}/v1/models")
        missing = client.post(f"{url}/v1/ocr", json={"document": "0" * 64, "page": 1})

    answer = PageAnswer.model_validate_json(page.content)
    assert json.loads(answer.model_dump_json(exclude_unset=True)) == page.json()
    assert (answer.dpi, answer.engine) == (150, "tesseract") and "Typed answers" in answer.text
    assert answer.lines and all(line.bbox and len(line.bbox) == 4 for line in answer.lines)
    assert DocumentStored.model_validate_json(stored.content) == DocumentStored(sha256=name, bytes=len(data), pages=1)
    assert PodModels.model_validate_json(models.content).documents.count == 1
    assert PodError.model_validate_json(missing.content).error == "document not cached"


@pytest.mark.parametrize("body", [b"[]", b'{"lines": []}', b'{"text": 5}', b'{"text": "x", "lines": "no"}'])
def test_what_is_no_page_answer_does_not_parse(body: bytes) -> None:
    with pytest.raises(ValueError):
        PageAnswer.model_validate_json(body)
