"""Worker hosts: each ``manage.py workers`` reports that its host is alive (``host_report``, from
its supervisor's clock); ``hosts_silent`` names those that stopped. Local pods belong to the host
that started them (``Pod.host``): only that host can reach them (loopback) or see their process;
another host marks them lost only once their host has been silent for HOST_LOST_AFTER_SECONDS
(pods/services/reconcile.py)."""

from __future__ import annotations

import os
from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from fleetadmin.models import WorkerHost


def host_report(*, started_at=None) -> None:
    """This host is alive (one UPDATE; the row is made on the first report)."""
    now = timezone.now()
    if not WorkerHost.objects.filter(host=settings.HOST_ID).update(reported_at=now, pid=os.getpid()):
        WorkerHost.objects.update_or_create(
            host=settings.HOST_ID, defaults={"reported_at": now, "pid": os.getpid(), "started_at": started_at or now}
        )


def hosts_silent(hosts: set[str], *, now=None) -> set[str]:
    """Of ``hosts``, those that have not reported for HOST_LOST_AFTER_SECONDS (or never did)."""
    if not hosts:
        return set()
    cutoff = (now or timezone.now()) - timedelta(seconds=settings.HOST_LOST_AFTER_SECONDS)
    reporting = set(WorkerHost.objects.filter(host__in=hosts, reported_at__gte=cutoff).values_list("host", flat=True))
    return hosts - reporting


def is_this_host(host: str) -> bool:
    """Whether a pod of this host (or one that any host reaches: no host) is this host's to reach."""
    return host in ("", settings.HOST_ID)
