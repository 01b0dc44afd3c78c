"""The migration that moves page results from files into the pages' rows
(ocrjobs/migrations/0007_page_result_in_database.py), run forwards and back on real rows."""

from __future__ import annotations

import json

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

BEFORE = [("ocrjobs", "0006_page_status_indexes")]
AFTER = [("ocrjobs", "0007_page_result_in_database")]


def migrate(targets):
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(targets)
    return executor.loader.project_state(targets).apps


@pytest.mark.django_db(transaction=True)
def test_result_files_are_loaded_into_their_rows_and_written_back_on_the_way_down(media_root, local_pool):
    apps = migrate(BEFORE)
    Job, Document, Page = (apps.get_model("ocrjobs", name) for name in ("Job", "Document", "Page"))
    job = Job.objects.create(pool_id=local_pool.pk)
    document = Document.objects.create(job=job, position=0, name="a.pdf", kind="pdf", source="jobs/1/0/source.pdf",
                                       size_bytes=1, page_count=3)  # fmt: skip
    result = {"text": "héllo\n", "lines": [], "confidence": 90.0}
    (media_root / "jobs/1/0/results").mkdir(parents=True)
    (media_root / "jobs/1/0/results/1-1-abc.json").write_text(json.dumps(result, ensure_ascii=False))
    common = {"job": job, "document": document, "pool_id": local_pool.pk, "image": "p.png"}
    done = Page.objects.create(number=1, status="done", result="jobs/1/0/results/1-1-abc.json", **common)
    gone = Page.objects.create(number=2, status="done", result="jobs/1/0/results/missing.json", **common)
    waiting = Page.objects.create(number=3, status="pending", result="", **common)

    Page = migrate(AFTER).get_model("ocrjobs", "Page")

    assert json.loads(Page.objects.get(pk=done.pk).result) == result
    assert Page.objects.get(pk=gone.pk).result == ""
    assert Page.objects.get(pk=waiting.pk).result == ""

    Page = migrate(BEFORE).get_model("ocrjobs", "Page")

    back = Page.objects.get(pk=done.pk).result
    assert json.loads((media_root / back).read_text()) == result
    migrate(MigrationExecutor(connection).loader.graph.leaf_nodes())  # the database as the other tests expect it


@pytest.mark.django_db(transaction=True)
def test_pages_the_vlm_read_before_answers_said_so_are_marked_markdown(local_pool):
    """ocrjobs/migrations/0029_result_markdown.py: the control plane no longer asks an engine's
    name, so a vlm reading stored before pods said ``markdown`` says it now; no other does."""
    apps = migrate([("ocrjobs", "0028_line_corrections")])
    Job, Document, Page = (apps.get_model("ocrjobs", name) for name in ("Job", "Document", "Page"))
    job = Job.objects.create(pool_id=local_pool.pk)
    document = Document.objects.create(job=job, position=0, name="a.pdf", kind="pdf", source="s.pdf", size_bytes=1,
                                       page_count=4)  # fmt: skip
    vlm = {"text": "# Title", "engine": "vlm", "confidence": 90}
    compact = json.dumps({"text": "| a |", "engine": "vlm"}, separators=(",", ":"))  # as a PageAnswer dumps
    tesseract = json.dumps({"text": "vlm", "engine": "tesseract", "lines": [{"text": '"vlm"'}]})
    common = {"job": job, "document": document, "pool_id": local_pool.pk, "status": "done"}
    read = Page.objects.create(number=1, result=json.dumps(vlm), **common)
    kept_first = Page.objects.create(number=2, result=compact, first_result=json.dumps(vlm), **common)
    other = Page.objects.create(number=3, result=tesseract, **common)
    broken = Page.objects.create(number=4, result='{"engine": "vlm", ', **common)

    Page = migrate([("ocrjobs", "0029_result_markdown")]).get_model("ocrjobs", "Page")

    assert json.loads(Page.objects.get(pk=read.pk).result) == {**vlm, "markdown": True}
    assert json.loads(Page.objects.get(pk=kept_first.pk).result) == {"text": "| a |", "engine": "vlm", "markdown": True}
    assert json.loads(Page.objects.get(pk=kept_first.pk).first_result) == {**vlm, "markdown": True}
    assert Page.objects.get(pk=other.pk).result == tesseract
    assert Page.objects.get(pk=broken.pk).result == '{"engine": "vlm", '
    migrate(MigrationExecutor(connection).loader.graph.leaf_nodes())
