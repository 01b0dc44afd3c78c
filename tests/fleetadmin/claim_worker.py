"""A process that claims and completes pages until none wait (for the concurrency test).

Once Django is set up it prints ``ready`` and waits for the go file (its third argument) to
exist, so that the test starts every worker's claiming at once, whatever each start-up took.
"""

from __future__ import annotations

import json
import os
import sys
import time
import uuid

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "fleetadmin.settings")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
django.setup()

from ocrjobs.services.pages import claims_renew, page_complete, pages_claim  # noqa: E402

GO_GUARD = 300  # seconds, against a test that died before saying go


def wait_for_go(go: str) -> None:
    print("ready", flush=True)
    deadline = time.monotonic() + GO_GUARD
    while not os.path.exists(go):
        if time.monotonic() > deadline:
            sys.exit(f"no go file {go} after {GO_GUARD} s")
        time.sleep(0.01)


def main(pool_id: int, batch: int) -> None:
    token = uuid.uuid4().hex
    completed = claimed = 0
    while True:
        pages = pages_claim(pool_id=pool_id, token=token, limit=batch)
        if not pages:
            break
        claimed += len(pages)
        for page in pages:
            claims_renew(token=token, page_ids=[page.id])
            result = {"text": f"page {page.id}", "lines": [], "confidence": 90.0}
            completed += page_complete(page_id=page.id, token=token, pod_id=None, result=result)
    print(json.dumps({"token": token, "claimed": claimed, "completed": completed}))


if __name__ == "__main__":
    wait_for_go(sys.argv[3])
    main(int(sys.argv[1]), int(sys.argv[2]))
