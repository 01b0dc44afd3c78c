"""Files kept across a refused submit of the job form.

A browser never fills a file input back in, so a form shown again after a refusal (a bad
deadline, a corrupt file beside good ones, a budget) would lose every file chosen. The form's
files are kept first, for their owner only and for ``KeptUpload.KEPT_FOR``; the form shows them
ticked, and the next submit takes those still ticked with any chosen then. (Checking the files
before they are sent would not do: a refusal can come from the submission itself, and a form
with no script must keep them too.)
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable

from django.core.files.uploadedfile import UploadedFile
from django.db import transaction
from django.utils import timezone

from ocrjobs.models import KeptUpload
from ocrjobs.services.submission import Upload
from ocrjobs.storage import document_delete, documents


def uploads_keep(*, owner, files: Iterable[UploadedFile]) -> list[KeptUpload]:
    """Each file stored for ``owner`` until it expires (an empty one is not worth keeping)."""
    kept = []
    expires_at = timezone.now() + KeptUpload.KEPT_FOR
    for file in files:
        if not file.size:
            continue
        file.seek(0)
        source = documents().save(f"kept/{uuid.uuid4().hex}/upload", file)
        kept.append(KeptUpload(owner=owner, name=file.name[:255], source=source, size_bytes=file.size,
                               expires_at=expires_at))  # fmt: skip
    return KeptUpload.objects.bulk_create(kept)


def uploads_kept(*, owner, ids: Iterable[str]) -> list[KeptUpload]:
    """Of ``ids`` (as the form sends them), the owner's uploads not expired, in the order kept.
    Anyone else's id, or one that expired, is left out."""
    wanted = [int(i) for i in ids if str(i).isdigit()]
    mine = KeptUpload.objects.filter(owner=owner, pk__in=wanted, expires_at__gt=timezone.now())
    return list(mine.order_by("pk"))


def uploads_of(kept: list[KeptUpload]) -> list[Upload]:
    """The kept files as a submission takes them (read from the documents' storage)."""
    return [Upload(name=k.name, file=documents().open(k.source, "rb")) for k in kept]


def uploads_drop(kept: Iterable[KeptUpload]) -> None:
    """Forget kept uploads (submitted, or left unticked), their files first."""
    kept = list(kept)
    for k in kept:
        document_delete(k.source)
    KeptUpload.objects.filter(pk__in=[k.pk for k in kept]).delete()


def uploads_drop_expired(*, now=None) -> int:
    """Drop every kept upload past its expiry (the minute's tick): the number dropped."""
    expired = list(KeptUpload.objects.filter(expires_at__lte=now or timezone.now())[:500])
    with transaction.atomic():
        uploads_drop(expired)
    return len(expired)
