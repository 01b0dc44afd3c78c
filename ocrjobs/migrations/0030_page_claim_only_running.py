"""A claim token only on a running page, as a check constraint: every change of a page away from
running already cleared its token, and the guarded UPDATEs of the dispatcher (results, pods, claims
renewed) now ask for the token alone. With the status in them too, PostgreSQL, whose statistics
still said that no page was running, read every running page (dead versions included) through the
status index for each batch instead of looking each page up by its id. A token left on a page that
is not running (none is made by the code) is cleared first."""

from django.db import migrations, models


def clear_stray_tokens(apps, schema_editor):
    Page = apps.get_model("ocrjobs", "Page")
    Page.objects.exclude(status="running").exclude(claim_token="").update(claim_token="")


class Migration(migrations.Migration):
    dependencies = [
        ("ocrjobs", "0029_result_markdown"),
        ("pods", "0022_pod_placed_in"),
    ]

    operations = [
        migrations.RunPython(clear_stray_tokens, migrations.RunPython.noop, elidable=True),
        migrations.AddConstraint(
            model_name="page",
            constraint=models.CheckConstraint(
                condition=models.Q(("claim_token", ""), ("status", "running"), _connector="OR"),
                name="page_claim_only_running",
            ),
        ),
    ]
