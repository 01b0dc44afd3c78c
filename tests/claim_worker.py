"""A process that claims and completes pages until none wait (for the concurrency test)."""

from __future__ import annotations

import json
import os
import sys
import uuid

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "fleetadmin.settings")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
django.setup()

from ocrjobs import services  # noqa: E402


def main(pool_id: int, batch: int) -> None:
    token = uuid.uuid4().hex
    completed = claimed = 0
    while True:
        pages = services.pages_claim(pool_id=pool_id, token=token, limit=batch)
        if not pages:
            break
        claimed += len(pages)
        for page in pages:
            services.claims_renew(token=token, page_ids=[page.id])
            result = {"text": f"page {page.id}", "lines": [], "confidence": 90.0}
            completed += services.page_complete(page_id=page.id, token=token, pod_id=None, result=result)
    print(json.dumps({"token": token, "claimed": claimed, "completed": completed}))


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
