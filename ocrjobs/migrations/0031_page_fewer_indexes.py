"""Fewer indexes on pages, each written again whenever a page's row is (its claim, its pod, its
result: three times a page at least). Document: served by page_number_unique, which begins with it.
The escalation's pool, a page's first pod and the pod its last attempt failed on: set on few pages,
indexed only where set (partial indexes), so that the other pages write nothing to them; a job's
escalated pages likewise (page_job_escalated_idx: the job page counts them). 13 indexes were written
for every page's update, 9 now."""

import django.db.models.deletion
from django.db import migrations, models

# Django's names for the indexes of these foreign keys (the same on either database).
FOREIGN_KEY_INDEXES = [
    ("ocrjobs_page_document_id_d492ff80", "document_id"),
    ("ocrjobs_page_escalated_from_id_b63b0a96", "escalated_from_id"),
    ("ocrjobs_page_failed_on_pod_id_edbc1e98", "failed_on_pod_id"),
    ("ocrjobs_page_first_pod_id_55ef7f01", "first_pod_id"),
]


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
        # Only the indexes go: altered as fields, Django would drop and add again each foreign key
        # (checking every page's row under a lock), and rebuild the whole table on SQLite.
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="page",
                    name="document",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="pages",
                        to="ocrjobs.document",
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
            ],
            database_operations=[
                migrations.RunSQL(
                    [f"DROP INDEX IF EXISTS {name}" for name, _ in FOREIGN_KEY_INDEXES],
                    [f"CREATE INDEX {name} ON ocrjobs_page ({column})" for name, column in FOREIGN_KEY_INDEXES],
                ),
            ],
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
        migrations.AddIndex(
            model_name="page",
            index=models.Index(
                condition=models.Q(("escalated_from__isnull", False)), fields=["job"], name="page_job_escalated_idx"
            ),
        ),
    ]
