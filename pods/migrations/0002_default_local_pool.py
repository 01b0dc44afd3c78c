from django.conf import settings
from django.db import migrations


def create_local_pool(apps, schema_editor):
    Pool = apps.get_model("pods", "Pool")
    Pool.objects.get_or_create(
        key="local",
        defaults={
            "name": "Local tesseract pods",
            "provider": "local",
            "min_pods": 0,
            "max_pods": settings.LOCAL_POD_MAX_PODS,
            "lanes_per_pod": settings.LOCAL_POD_LANES,
            "max_parallel_boots": 2,
            "idle_seconds": 300,
        },
    )


class Migration(migrations.Migration):
    dependencies = [("pods", "0001_initial")]
    operations = [migrations.RunPython(create_local_pool, migrations.RunPython.noop)]
