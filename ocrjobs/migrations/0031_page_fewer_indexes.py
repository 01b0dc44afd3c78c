"""Fewer indexes on pages, each written again whenever a page's row is (its claim, its pod, its
result: three times a page at least). Job and document: served by the indexes that begin with them
(page_job_status_conf_idx, page_number_unique). The escalation's pool, a page's first pod and the
pod its last attempt failed on: set on few pages, indexed only where set (partial indexes), so that
the other pages write nothing to them. 13 indexes were written for every page's update, 8 now."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("ocrjobs", "0030_page_claim_only_running"),
        ("pods", "0022_pod_placed_in"),
    ]

    operations = [
        migrations.RemoveIndex(
            model_name="page",
            name="page_escalated_idx",
        ),
        migrations.AlterField(
            model_name="page",
            name="document",
            field=models.ForeignKey(
                db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name="pages", to="ocrjobs.document"
            ),
        ),
        migrations.AlterField(
            model_name="page",
            name="escalated_from",
            field=models.ForeignKey(
                blank=True,
                db_index=False,
                null=True,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="+",
                to="pods.pool",
            ),
        ),
        migrations.AlterField(
            model_name="page",
            name="failed_on_pod",
            field=models.ForeignKey(
                blank=True,
                db_index=False,
                null=True,
                on_delete=django.db.models.deletion.SET_NULL,
                related_name="+",
                to="pods.pod",
            ),
        ),
        migrations.AlterField(
            model_name="page",
            name="first_pod",
            field=models.ForeignKey(
                blank=True,
                db_index=False,
                null=True,
                on_delete=django.db.models.deletion.SET_NULL,
                related_name="+",
                to="pods.pod",
            ),
        ),
        migrations.AlterField(
            model_name="page",
            name="job",
            field=models.ForeignKey(
                db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name="pages", to="ocrjobs.job"
            ),
        ),
        migrations.AddIndex(
            model_name="page",
            index=models.Index(
                condition=models.Q(("escalated_from__isnull", False)),
                fields=["escalated_from", "escalated_at"],
                name="page_escalated_idx",
            ),
        ),
        migrations.AddIndex(
            model_name="page",
            index=models.Index(
                condition=models.Q(("first_pod__isnull", False)), fields=["first_pod"], name="page_first_pod_idx"
            ),
        ),
        migrations.AddIndex(
            model_name="page",
            index=models.Index(
                condition=models.Q(("failed_on_pod__isnull", False)),
                fields=["failed_on_pod"],
                name="page_failed_on_pod_idx",
            ),
        ),
    ]
