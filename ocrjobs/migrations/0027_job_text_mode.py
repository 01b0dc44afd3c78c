# skip_text_pages becomes text_mode (issue 40, item 3): a job that skipped pages with text skips
# them still; any other job's pages were all read, which redo does too.

from django.db import migrations, models


def modes_from_skip(apps, schema_editor):
    Job = apps.get_model("ocrjobs", "Job")
    Job.objects.filter(skip_text_pages=True).update(text_mode="skip")


def skip_from_modes(apps, schema_editor):
    Job = apps.get_model("ocrjobs", "Job")
    Job.objects.filter(text_mode="skip").update(skip_text_pages=True)


class Migration(migrations.Migration):

    dependencies = [
        ('ocrjobs', '0026_document_split_at'),
    ]

    operations = [
        migrations.AddField(
            model_name='job',
            name='text_mode',
            field=models.CharField(choices=[('skip', 'skip: a page with a usable text layer keeps it, no OCR (--skip-text)'), ('redo', 'redo: its invisible text layer replaced by ours, visible text kept (--redo-ocr)'), ('force', 'force: every page read, the searchable PDF carries our text only (--force-ocr)')], default='redo', max_length=5),
        ),
        migrations.RunPython(modes_from_skip, skip_from_modes),
        migrations.RemoveField(
            model_name='job',
            name='skip_text_pages',
        ),
    ]
