"""Documents' storage (ocrjobs/storage.py) on S3: a real S3 server over HTTP (``rclone serve s3``
over a temporary folder, started here), through django-storages and boto3, as a deployment of
several hosts configures it (STORAGE_S3_*). What one host stores there, another reads; nothing a
job needs stays on the storing host's disk."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from ocrjobs import storage
from ocrjobs.models import Page
from ocrjobs.storage import (
    document_bytes,
    document_delete,
    document_local,
    document_store,
    documents,
)
from tests.factories import PAGES_TRUTH, pdf_bytes
from tests.ocrjobs.helpers import files_under, split, submit
from tools.processes import REPO, child_env


def test_a_large_document_goes_to_s3_in_parts_and_every_reader_gets_it_whole(s3, tmp_path):
    bucket, _ = s3
    data = os.urandom(9 * 1024 * 1024)  # above boto3's 8 MiB threshold: a multipart upload
    staged = tmp_path / "staged"
    staged.write_bytes(data)

    name = document_store("documents/abc/source.pdf", staged)

    assert name == "documents/abc/source.pdf"
    assert not staged.exists()  # uploaded, then the staged copy removed
    assert (bucket / name).read_bytes() == data  # on the server's disk: really sent over S3
    assert document_bytes(name) == data  # the dispatcher's read
    with document_local(name) as local:  # the split's read: a temporary copy
        assert local.read_bytes() == data
    assert not local.exists()
    document_delete(name)
    assert not documents().exists(name)


def test_a_job_submitted_and_split_on_s3_keeps_nothing_on_the_local_disk(s3, ordinary_user, media_root):
    bucket, _ = s3
    job = submit(ordinary_user, {"report.pdf": pdf_bytes(PAGES_TRUTH[:2])})
    split(job)

    document = job.documents.get()
    assert (bucket / document.source).read_bytes()[:5] == b"%PDF-"
    pages = list(Page.objects.filter(job=job).order_by("number"))
    assert [p.number for p in pages] == [1, 2]
    assert document_bytes(document.source) == pdf_bytes(PAGES_TRUTH[:2])  # what a dispatcher sends a pod
    assert files_under(media_root) == []  # staging emptied; the document lives in S3


def test_the_viewer_streams_a_document_from_s3_whole_and_in_ranges(s3, client, ordinary_user, monkeypatch):
    monkeypatch.setattr(storage, "CHUNK", 64 * 1024)
    data = pdf_bytes(PAGES_TRUTH[:2])
    job = submit(ordinary_user, {"report.pdf": data})
    url = f"/jobs/{job.pk}/documents/{job.documents.get().pk}"
    client.force_login(ordinary_user)

    whole = client.get(url)
    middle = client.get(url, headers={"Range": "bytes=1000-70999"})

    assert b"".join(whole.streaming_content) == data
    chunks = list(middle.streaming_content)
    assert b"".join(chunks) == data[1000:71000] and max(len(chunk) for chunk in chunks) <= 64 * 1024
    assert middle.status_code == 206 and middle["Content-Range"] == f"bytes 1000-70999/{len(data)}"


def test_the_settings_point_documents_at_s3_from_the_environment(s3, tmp_path):
    _, env = s3
    code = (
        "import django, json; django.setup(); "
        "from ocrjobs.storage import documents, document_save_bytes, document_bytes; "
        "name = document_save_bytes('x/hello.txt', b'hello'); "
        "print(json.dumps({'backend': type(documents()).__name__, 'read': document_bytes(name).decode()}))"
    )
    child = {**child_env(tmp_path, **env), "DJANGO_SETTINGS_MODULE": "fleetadmin.settings"}
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=child, capture_output=True, text=True, timeout=60)

    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"backend": "S3Storage", "read": "hello"}
    assert (s3[0] / "x/hello.txt").read_bytes() == b"hello"
    assert not Path(child["MEDIA_ROOT"], "x").exists()
