"""Pages the vlm engine read before pods said whether their text is Markdown: their stored
readings say so now (``"markdown": true``), as a pod's answer does, so that the control plane
shows and exports them as Markdown without asking an engine's name. Data only; nothing on the
way down (the key is ignored by code that does not know it)."""

import json

from django.db import migrations

BATCH = 500


def _marked(stored: str) -> str | None:
    """The reading with ``markdown`` set, or None when it needs nothing (not vlm's, or unreadable)."""
    try:
        reading = json.loads(stored)
    except ValueError:
        return None
    if not isinstance(reading, dict) or reading.get("engine") != "vlm" or "markdown" in reading:
        return None
    return json.dumps({**reading, "markdown": True}, ensure_ascii=False)


def mark_markdown(apps, schema_editor):
    Page = apps.get_model("ocrjobs", "Page")
    for column in ("result", "first_result"):
        # A cheap filter first: a vlm reading has the word in it, however it was dumped.
        ids = list(Page.objects.filter(**{f"{column}__contains": '"vlm"'}).order_by("id").values_list("id", flat=True))
        for start in range(0, len(ids), BATCH):
            pages = list(Page.objects.filter(id__in=ids[start : start + BATCH]).only("id", column))
            changed = []
            for page in pages:
                marked = _marked(getattr(page, column))
                if marked is not None:
                    setattr(page, column, marked)
                    changed.append(page)
            Page.objects.bulk_update(changed, [column])


class Migration(migrations.Migration):
    dependencies = [("ocrjobs", "0028_line_corrections")]

    operations = [migrations.RunPython(mark_markdown, migrations.RunPython.noop, elidable=True)]
