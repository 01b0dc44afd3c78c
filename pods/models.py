from __future__ import annotations

from datetime import datetime
from decimal import Decimal

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.utils import timezone


class Pool(models.Model):
    """A set of interchangeable pods of one provider, grown and shed together."""

    class Provider(models.TextChoices):
        LOCAL = "local", "Local subprocesses"
        RUNPOD = "runpod", "RunPod"

    key = models.SlugField(max_length=40, unique=True)
    name = models.CharField(max_length=100, blank=True)
    provider = models.CharField(max_length=20, choices=Provider.choices, default=Provider.LOCAL)
    min_pods = models.PositiveIntegerField(default=0, help_text="warm floor kept even without work")
    max_pods = models.PositiveIntegerField(default=1)
    lanes_per_pod = models.PositiveIntegerField(default=1, validators=[MinValueValidator(1), MaxValueValidator(256)])
    max_parallel_boots = models.PositiveIntegerField(default=4, validators=[MinValueValidator(1)])
    idle_seconds = models.PositiveIntegerField(default=300, help_text="idle time before a pod above the floor is shed")
    config = models.JSONField(default=dict, blank=True, help_text="provider settings (candidates, image, env)")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["key"]

    def __str__(self) -> str:
        return self.key

    def to_dict(self) -> dict:
        return {
            "key": self.key,
            "name": self.name or self.key,
            "provider": self.provider,
            "min_pods": self.min_pods,
            "max_pods": self.max_pods,
            "lanes_per_pod": self.lanes_per_pod,
        }


class PodQuerySet(models.QuerySet):
    def alive(self) -> PodQuerySet:
        return self.filter(state__in=Pod.ALIVE_STATES)

    def ready(self) -> PodQuerySet:
        return self.filter(state=Pod.State.READY)


class Pod(models.Model):
    class State(models.TextChoices):
        BOOTING = "booting"
        READY = "ready"
        DRAINING = "draining"
        TERMINATED = "terminated"
        FAILED = "failed"
        LOST = "lost"

    class Reason(models.TextChoices):
        DEMAND = "demand", "pages waiting"
        WARM = "warm", "warm floor"
        MANUAL = "manual", "scale request"

    ALIVE_STATES = (State.BOOTING, State.READY, State.DRAINING)
    ENDED_STATES = (State.TERMINATED, State.FAILED, State.LOST)

    pool = models.ForeignKey(Pool, on_delete=models.PROTECT, related_name="pods")
    name = models.CharField(max_length=120, unique=True)
    provider_id = models.CharField(max_length=120, blank=True, db_index=True)
    state = models.CharField(max_length=20, choices=State.choices, default=State.BOOTING, db_index=True)
    reason = models.CharField(max_length=20, choices=Reason.choices, default=Reason.DEMAND)
    base_url = models.CharField(max_length=200, blank=True)
    lanes = models.PositiveIntegerField(default=1)
    gpu_type = models.CharField(max_length=100, blank=True)
    cloud_type = models.CharField(max_length=20, blank=True)
    data_center = models.CharField(max_length=40, blank=True)
    cost_per_hr = models.DecimalField(max_digits=10, decimal_places=4, default=Decimal("0"))
    created_at = models.DateTimeField(default=timezone.now)
    ready_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    last_busy_at = models.DateTimeField(null=True, blank=True)
    error = models.TextField(blank=True)

    objects = PodQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return self.name

    @property
    def is_alive(self) -> bool:
        return self.state in self.ALIVE_STATES

    def spend(self, *, at: datetime | None = None) -> Decimal:
        """Dollars billed so far: from creation until the pod ended (or now)."""
        end = self.ended_at or at or timezone.now()
        seconds = max(0.0, (end - self.created_at).total_seconds())
        return (self.cost_per_hr * Decimal(seconds) / Decimal(3600)).quantize(Decimal("0.0001"))

    def mark_ready(self, *, base_url: str) -> None:
        self.state = self.State.READY
        self.base_url = base_url
        self.ready_at = timezone.now()
        self.last_busy_at = self.ready_at
        self.save(update_fields=["state", "base_url", "ready_at", "last_busy_at"])

    def mark_ended(self, state: str, *, error: str = "") -> None:
        self.state = state
        self.ended_at = self.ended_at or timezone.now()
        if error:
            self.error = error[:2000]
        self.save(update_fields=["state", "ended_at", "error"])

    def to_dict(self) -> dict:
        return {
            "id": self.pk,
            "name": self.name,
            "pool": self.pool.key,
            "state": self.state,
            "reason": self.reason,
            "provider_id": self.provider_id,
            "lanes": self.lanes,
            "gpu_type": self.gpu_type,
            "data_center": self.data_center,
            "cost_per_hr": float(self.cost_per_hr),
            "spend": float(self.spend()),
            "created_at": self.created_at.isoformat(),
            "ready_at": self.ready_at.isoformat() if self.ready_at else None,
            "ended_at": self.ended_at.isoformat() if self.ended_at else None,
            "error": self.error,
        }


def pod_name(pool: Pool, suffix: str) -> str:
    """Pods carry the deployment prefix and pool key so reconcile can find them."""
    return f"{settings.DEPLOYMENT_PREFIX}-{pool.key}-{suffix}"
