from __future__ import annotations

from datetime import datetime, timedelta

from django.db import models
from django.db.models import BooleanField, Case, Q, Value, When
from django.utils import timezone

# A loop that has not reported for this long is shown as stale: its process is
# stuck (a stall longer than this) or gone (killed, crashed) without stop().
STALE_AFTER = timedelta(seconds=10)
# Rows of processes gone for this long are deleted when a new loop starts.
FORGET_AFTER = timedelta(days=1)


class LoopHeartbeatQuerySet(models.QuerySet):
    def running(self) -> LoopHeartbeatQuerySet:
        """Loops that have not said they stopped (some may be stale)."""
        return self.filter(stopped_at__isnull=True)

    def stale(self, *, now: datetime | None = None) -> LoopHeartbeatQuerySet:
        """Running loops that stopped reporting."""
        return self.running().filter(updated_at__lt=(now or timezone.now()) - STALE_AFTER)

    def with_stale(self, *, now: datetime | None = None) -> LoopHeartbeatQuerySet:
        """Annotate ``stale``: True for a running loop whose last report is older than STALE_AFTER."""
        cutoff = (now or timezone.now()) - STALE_AFTER
        return self.annotate(
            stale=Case(
                When(Q(stopped_at__isnull=True, updated_at__lt=cutoff), then=Value(True)),
                default=Value(False),
                output_field=BooleanField(),
            )
        )

    def for_dashboard(self, *, now: datetime | None = None) -> LoopHeartbeatQuerySet:
        """Every loop that runs or ran until recently without a clean stop, with ``stale``; also /metrics."""
        now = now or timezone.now()
        return self.running().filter(updated_at__gte=now - FORGET_AFTER).with_stale(now=now)

    def forget_old(self, *, now: datetime | None = None) -> int:
        """Delete rows that nobody updated for FORGET_AFTER (processes long gone)."""
        return self.filter(updated_at__lt=(now or timezone.now()) - FORGET_AFTER).delete()[0]


class LoopHeartbeat(models.Model):
    """The last report of one event loop's sampler (fleetadmin.loopwatch), one row per (host, pid, name)."""

    class Kind(models.TextChoices):
        FRONT = "front"
        DISPATCHER = "dispatcher"
        WORKER = "worker"

    name = models.CharField(max_length=100)
    kind = models.CharField(max_length=20, choices=Kind.choices)
    host = models.CharField(max_length=100)
    pid = models.PositiveIntegerField()
    lag_s = models.FloatField(default=0.0, help_text="how late the sampler woke last time")
    worst_lag_s = models.FloatField(default=0.0)
    stalls = models.PositiveIntegerField(default=0, help_text="wake-ups later than the stall threshold")
    blocked_s = models.FloatField(default=0.0, help_text="sum of the lag of every stall")
    started_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)
    stopped_at = models.DateTimeField(null=True, blank=True)

    objects = LoopHeartbeatQuerySet.as_manager()

    class Meta:
        ordering = ["kind", "host", "pid", "name"]
        constraints = [models.UniqueConstraint(fields=["host", "pid", "name"], name="loopheartbeat_host_pid_name")]
        indexes = [models.Index(fields=["updated_at"], name="loopheartbeat_updated_idx")]

    def __str__(self) -> str:
        return f"{self.name} ({self.host}:{self.pid})"

    def is_stale(self, *, now: datetime | None = None) -> bool:
        return self.stopped_at is None and self.updated_at < (now or timezone.now()) - STALE_AFTER

    def to_dict(self, *, now: datetime | None = None) -> dict:
        now = now or timezone.now()
        return {
            "name": self.name,
            "kind": self.kind,
            "host": self.host,
            "pid": self.pid,
            "lag_s": self.lag_s,
            "worst_lag_s": self.worst_lag_s,
            "stalls": self.stalls,
            "blocked_s": self.blocked_s,
            "started_at": self.started_at.isoformat(),
            "updated_at": self.updated_at.isoformat(),
            "stopped_at": self.stopped_at.isoformat() if self.stopped_at else None,
            "age_s": round(max(0.0, (now - self.updated_at).total_seconds()), 1),
            "stale": self.is_stale(now=now),
        }


class WorkerHost(models.Model):
    """A worker host (``manage.py workers``) and when it last reported, written by its supervisor's
    clock (fleetadmin/hosts.py). Local pods belong to their host: a host that stopped reporting for
    HOST_LOST_AFTER_SECONDS has its local pods marked lost by whichever host reconciles."""

    host = models.CharField(max_length=100, unique=True)
    pid = models.PositiveIntegerField()
    started_at = models.DateTimeField(default=timezone.now)
    reported_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["host"]

    def __str__(self) -> str:
        return self.host


class Deployment(models.Model):
    """This deployment's identity, one row that every host shares (fleetadmin/deployment.py)."""

    ONLY = 1

    pod_prefix = models.CharField(max_length=20, help_text="the first part of every pod name")
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [models.CheckConstraint(condition=Q(pk=1), name="deployment_only_one_row")]

    def __str__(self) -> str:
        return self.pod_prefix
