"""A stored document is on the disk before the job that names it is answered: the staged file's
bytes are synced before the rename that names it, then the folders that hold it (a power loss
after the answer must not lose a document whose job survived)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ocrjobs import storage
from ocrjobs.models import Job
from tests.factories import pdf_bytes
from tests.ocrjobs.helpers import submit


@pytest.fixture
def synced(monkeypatch) -> list[tuple[Path, bool]]:
    """Each fsync: the path synced, and whether the document's stored file existed then."""
    calls: list[tuple[Path, bool]] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        path = Path(os.readlink(f"/proc/self/fd/{fd}"))
        named = any(p.name.startswith("source") for p in Path(storage.documents().location).rglob("*") if p.is_file())
        calls.append((path, named))
        real(fd)

    monkeypatch.setattr(storage.os, "fsync", fsync)
    return calls


def test_a_document_is_synced_before_it_is_named_and_its_folders_after(media_root, tmp_path, synced):
    staged = tmp_path / "staged.pdf"
    staged.write_bytes(pdf_bytes())
    name = storage.document_store("documents/abc/source.pdf", staged)
    stored = Path(storage.documents().path(name))
    assert stored.read_bytes() == pdf_bytes() and not staged.exists()
    assert synced[0] == (staged, False)  # its bytes, before the rename
    assert synced[1:] == [(stored.parent, True), (stored.parent.parent, True), (media_root, True)]


def test_a_submission_stores_its_documents_durably(media_root, ordinary_user, synced):
    job = submit(ordinary_user, {"report.pdf": pdf_bytes()})
    stored = Path(storage.documents().path(job.documents.get().source))
    assert Job.objects.filter(pk=job.pk).exists()
    assert stored.parent in [path for path, _ in synced] and media_root in [path for path, _ in synced]
    assert synced[0][1] is False  # the upload's bytes synced before it was named


def test_a_submissions_documents_sync_each_folder_once_after_all_are_named(media_root, ordinary_user, synced):
    job = submit(ordinary_user, {f"report-{i}.pdf": pdf_bytes() for i in range(3)})
    stored = [Path(storage.documents().path(d.source)) for d in job.documents.order_by("position")]
    folders = [path for path, _ in synced if path.is_dir()]
    # each document's own folder, and once only the documents' folder and the root above them
    assert sorted(folders) == sorted([path.parent for path in stored] + [stored[0].parent.parent, media_root])
    files = [i for i, (path, _) in enumerate(synced) if not path.is_dir()]
    assert len(files) == 3 and max(files) < min(i for i, (path, _) in enumerate(synced) if path.is_dir())
