"""Shared checks and set-ups for the ocrjobs tests."""

from __future__ import annotations

import asyncio
import io
import json
import struct
import uuid
from pathlib import Path

from django.utils import timezone
from PIL import Image

from ocrjobs.dispatch import loop as dispatch
from ocrjobs.models import Document, Job, Page
from ocrjobs.services.dispatchers import dispatcher_register
from ocrjobs.services.jobs import job_refresh
from ocrjobs.services.pages import page_attempt_failed, page_complete, pages_claim
from ocrjobs.services.split import document_split
from ocrjobs.services.submission import Upload, job_submit
from pods.models import Pool
from podserver.answers import PageAnswer
from tests.helpers import auth


def reload(obj):
    """The model instance, read again from its row."""
    obj.refresh_from_db()
    return obj


def files_under(root: Path) -> list[Path]:
    """Every file below root (empty directories are allowed to stay)."""
    return sorted(p for p in root.rglob("*") if not p.is_dir())


def assert_nothing_made(media_root: Path) -> None:
    assert Job.objects.count() == 0
    assert Document.objects.count() == 0
    assert Page.objects.count() == 0
    assert files_under(media_root) == []


def tiff_bytes(sizes: list[tuple[int, int]]) -> bytes:
    """A multi-frame TIFF, one white frame per size."""
    frames = [Image.new("L", size, 255) for size in sizes]
    buffer = io.BytesIO()
    frames[0].save(buffer, format="TIFF", save_all=True, append_images=frames[1:], compression="tiff_deflate")
    return buffer.getvalue()


def submit(owner, files: dict[str, bytes], pool_key: str = "local", **options) -> Job:
    """The job of ``files`` (name: bytes), submitted as the form or the API would (``options``: job_submit's)."""
    uploads = [Upload(name=name, file=io.BytesIO(data)) for name, data in files.items()]
    return job_submit(owner=owner, uploads=uploads, pool_key=pool_key, **options)


def post_json(client, token: str, body: dict, key: str | None = None):
    """POST /v1/jobs with a JSON ``body`` (and an Idempotency-Key when ``key``)."""
    headers = auth(token)
    if key is not None:
        headers["Idempotency-Key"] = key
    return client.post("/v1/jobs", json.dumps(body), content_type="application/json", headers=headers)


def split(job: Job) -> None:
    for document_id in job.documents.values_list("pk", flat=True):
        document_split(document_id=document_id)


def result_for(text: str) -> dict:
    """What a pod answers for a page, made up."""
    words = text.split()
    return {
        "text": text + "\n",
        "lines": [{"text": text, "box": [10, 20, 10 + 12 * len(text), 50], "confidence": 91.5}],
        "confidence": 91.5 if words else None,
        "width": 1400,
        "height": 600,
    }


def answer_for(text: str) -> PageAnswer:
    """``result_for`` as the dispatcher hands it on: parsed into the pod's typed answer."""
    return PageAnswer.model_validate(result_for(text))


def complete_all(
    job: Job,
    texts: dict[tuple[int, int], str] | None = None,
    failures: dict[tuple[int, int], str] | None = None,
    *,
    results: dict[tuple[int, int], dict] | None = None,
) -> None:
    """Claim every waiting page of the job's pool and finish it as a dispatcher would.

    texts maps (document position, page number) to the page's made-up text (the
    default says where the page came from); failures maps them to an error, and
    those pages fail for good instead; results maps every page to the whole result a pod
    would answer (instead of texts).
    """
    token = uuid.uuid4().hex
    claimed = pages_claim(pool_id=job.pool_id, token=token, limit=10_000)
    where = {
        pk: (position, number)
        for pk, position, number in Page.objects.filter(pk__in=[c.id for c in claimed]).values_list(
            "pk", "document__position", "number"
        )
    }
    for claim in claimed:
        key = where[claim.id]
        if failures and key in failures:
            outcome = page_attempt_failed(page_id=claim.id, token=token, pod_id=None, error=failures[key], final=True)
            assert outcome == "failed"
            continue
        if results is not None:
            result = results[key]
        else:
            result = result_for((texts or {}).get(key, f"document {key[0]} page {key[1]}"))
        assert page_complete(page_id=claim.id, token=token, pod_id=None, result=result)
    job_refresh(job_id=job.pk)


def run_dispatch_loop(pool: Pool, *, before=None) -> dispatch.DispatchLoop:
    """Register a dispatcher for the pool and run its loop here until it ends (its backlog empty).
    ``before(dispatcher)`` runs once it is registered, before its loop starts."""
    dispatcher = dispatcher_register(pool_id=pool.pk)
    assert dispatcher is not None
    if before is not None:
        before(dispatcher)
    loop = dispatch.DispatchLoop(dispatcher)
    asyncio.run(dispatch._watched(loop, name=f"dispatcher pool {pool.key}"))
    return loop


def blank_tiff_frames(count: int, width: int = 10_000, height: int = 10_000) -> bytes:
    """A Group 4 TIFF of ``count`` blank ``width``×``height`` frames that share one strip: the
    review's N2 document (3,000 frames of 100 megapixels in a few hundred kilobytes), readable."""
    buffer = io.BytesIO()
    Image.new("1", (width, height), 1).save(buffer, format="TIFF", compression="group4", strip_size=2**31 - 1)
    with Image.open(io.BytesIO(buffer.getvalue())) as one:
        offset, length = one.tag_v2[273][0], one.tag_v2[279][0]
    strip = buffer.getvalue()[offset : offset + length]
    tags = lambda at: [(256, 4, 1, width), (257, 4, 1, height), (258, 3, 1, 1), (259, 3, 1, 4),  # noqa: E731
                       (262, 3, 1, 1), (273, 4, 1, at), (277, 3, 1, 1), (278, 4, 1, height), (279, 4, 1, length)]  # fmt: skip
    ifd_size = 2 + 12 * len(tags(0)) + 4
    strip_at = 8
    first_ifd = strip_at + length + (length % 2)
    out = b"II*\x00" + struct.pack("<I", first_ifd) + strip + b"\0" * (length % 2)
    for n in range(count):
        following = first_ifd + (n + 1) * ifd_size if n + 1 < count else 0
        entries = tags(strip_at)
        out += struct.pack("<H", len(entries)) + b"".join(struct.pack("<HHII", *e) for e in entries)
        out += struct.pack("<I", following)
    return out


def job_with_pages(owner, pool, *, status: str, pages: dict[str, int]) -> Job:
    """A job of one split PDF document whose pages are in ``pages`` ({status: how many}), made as
    rows (no file, no split): a done page reads "x"."""
    finished = timezone.now() if status in Job.FINISHED else None
    job = Job.objects.create(owner=owner, pool=pool, status=status, finished_at=finished)
    document = Document.objects.create(job=job, position=0, name="a.pdf", kind="pdf", size_bytes=10,
                                       page_count=sum(pages.values()), status=Document.Status.SPLIT)  # fmt: skip
    number = 0
    for page_status, count in pages.items():
        for _ in range(count):
            number += 1
            Page.objects.create(job=job, document=document, pool=pool, number=number, status=page_status,
                                result='{"text": "x"}' if page_status == "done" else "")  # fmt: skip
    return job
