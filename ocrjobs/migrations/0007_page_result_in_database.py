"""Page results move from files under MEDIA_ROOT into the pages' rows (JSON text), so that any
host serves them; documents and page images are named in the documents' storage (whose
default, a FileSystemStorage under MEDIA_ROOT, reads the names already stored)."""

import logging

from django.conf import settings
from django.db import migrations, models

log = logging.getLogger(__name__)

BATCH = 500


def load_result_files(apps, schema_editor):
    """Each done page's result file, read into its row; a file that is gone leaves an empty result
    (the page stays done: its text is lost either way) and is logged."""
    Page = apps.get_model("ocrjobs", "Page")
    # A path (what the rows held so far), not JSON text: results always start with "{".
    pages = Page.objects.exclude(result="").exclude(result__startswith="{").order_by("pk")
    batch = []
    missing = 0
    for page in pages.only("pk", "result").iterator(chunk_size=BATCH):
        path = settings.MEDIA_ROOT / page.result
        try:
            page.result = path.read_text()
        except OSError:
            missing += 1
            page.result = ""
        batch.append(page)
        if len(batch) >= BATCH:
            Page.objects.bulk_update(batch, ["result"])
            batch = []
    if batch:
        Page.objects.bulk_update(batch, ["result"])
    if missing:
        log.warning("%d result files were missing; their pages keep an empty result", missing)


def write_result_files(apps, schema_editor):
    """Back: each result into a file again, as the old code reads it."""
    Page = apps.get_model("ocrjobs", "Page")
    batch = []
    for page in Page.objects.filter(result__startswith="{").select_related("document").iterator(chunk_size=BATCH):
        relative = f"jobs/{page.job_id}/{page.document.position}/results/{page.pk}-migrated.json"
        path = settings.MEDIA_ROOT / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(page.result)
        page.result = relative
        batch.append(page)
        if len(batch) >= BATCH:
            Page.objects.bulk_update(batch, ["result"])
            batch = []
    if batch:
        Page.objects.bulk_update(batch, ["result"])


class Migration(migrations.Migration):
    dependencies = [
        ("ocrjobs", "0006_page_status_indexes"),
    ]

    operations = [
        migrations.AlterField(
            model_name="document",
            name="source",
            field=models.CharField(blank=True, help_text="its name in the documents' storage", max_length=500),
        ),
        migrations.AlterField(
            model_name="page",
            name="image",
            field=models.CharField(help_text="its name in the documents' storage", max_length=500),
        ),
        migrations.AlterField(
            model_name="page",
            name="result",
            field=models.TextField(blank=True, help_text="the pod's answer as JSON text"),
        ),
        migrations.RunPython(load_result_files, write_result_files, elidable=True),
    ]
