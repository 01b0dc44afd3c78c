"""Every periodic task, declared once and upserted by name on start-up."""

from __future__ import annotations

from fleetadmin.clusters import SHORT, cluster_name

SCHEDULES = [
    {
        "name": "scaler tick",
        "func": "pods.tasks.scaler_tick",
        "schedule_type": "I",  # minutes; ticks are also nudged on submit, pod ready and dispatcher end
        "minutes": 1,
    },
]


def setup_schedules() -> list[str]:
    """Upsert every schedule, pinned to the short tasks' cluster (fleetadmin/clusters.py)."""
    from django_q.models import Schedule

    names = []
    for spec in SCHEDULES:
        spec = dict(spec)
        name = spec.pop("name")
        Schedule.objects.update_or_create(name=name, defaults={**spec, "repeats": -1, "cluster": cluster_name(SHORT)})
        names.append(name)
    Schedule.objects.exclude(name__in=names).filter(func__startswith=("pods.")).delete()
    Schedule.objects.exclude(name__in=names).filter(func__startswith=("ocrjobs.")).delete()
    return names
