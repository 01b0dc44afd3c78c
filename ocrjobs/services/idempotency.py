"""Idempotent submission: an ``Idempotency-Key`` makes a retried POST /v1/jobs answer the job the
first one made (per user, for 24 hours) instead of running and paying for it twice."""

from __future__ import annotations

import hashlib
import json
import re

from django.db import IntegrityError

from fleetadmin.errors import Invalid, Unprocessable
from ocrjobs.models import Job, SubmissionKey
from ocrjobs.services.submission import CHUNK, Upload, job_submit

IDEMPOTENCY_KEY_RE = re.compile(r"[\x21-\x7e]{1,255}")


def submission_fingerprint(*, fields: dict, uploads: list[Upload]) -> str:
    """What makes two submissions the same: their fields and each file's name and bytes (the
    multipart boundary and the order of form fields do not count). A file hashed as it was parsed
    (``sha256``: ocrjobs.uploads) is not read again; any other is read once and rewound."""
    digest = hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode())
    for upload in uploads:
        sha256 = getattr(upload.file, "sha256", None)
        if sha256 is None:
            content = hashlib.sha256()
            while chunk := upload.file.read(CHUNK):
                content.update(chunk)
            upload.file.seek(0)
            sha256 = content.hexdigest()
        digest.update(f"\0{upload.name}\0{sha256}".encode())
    return digest.hexdigest()


def submission_key_job(*, owner, key: str, fingerprint: str) -> Job | None:
    """The job ``key`` made for ``owner`` within the last 24 hours, or None. The same key with
    another submission is refused (422). A key older than 24 hours is forgotten."""
    row = SubmissionKey.objects.select_related("job").filter(owner=owner, key=key).first()
    if row is None:
        return None
    if row.expired:
        SubmissionKey.objects.filter(pk=row.pk).delete()
        return None
    if row.fingerprint != fingerprint:
        raise Unprocessable(
            f"the Idempotency-Key {key[:60]!r} was used for a different submission (job {row.job_id}); "
            "send a new key for a new submission",
        )
    return row.job


def job_submit_once(*, owner, key: str, fields: dict, uploads: list[Upload], **submission) -> tuple[Job, bool]:
    """``job_submit`` under an ``Idempotency-Key``: (the job, whether this call made it).

    A retry of a submission whose answer was lost gets the first job back. Two requests racing
    on one key both pass the look-up; the unique constraint fails the second's insert, its
    whole submission rolls back (no rows, no files), and it answers with the first's job."""
    if not IDEMPOTENCY_KEY_RE.fullmatch(key):
        raise Invalid("the Idempotency-Key header must be 1 to 255 visible ASCII characters")
    fingerprint = submission_fingerprint(fields=fields, uploads=uploads)
    job = submission_key_job(owner=owner, key=key, fingerprint=fingerprint)
    if job is not None:
        return job, False
    try:
        return job_submit(owner=owner, uploads=uploads, submission_key=(key, fingerprint), **submission), True
    except IntegrityError:
        job = submission_key_job(owner=owner, key=key, fingerprint=fingerprint)
        if job is None:
            raise
        return job, False
