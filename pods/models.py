"""The pods app's models: pools, pods, capacity verdicts, boot attempts, the price catalogue,
alerts, spend entries, pass leases, scale requests, and the tallies /metrics reads.

Length: one module of models, as Django expects; each model is small and carries only its own
state transitions.
"""

from __future__ import annotations

import secrets
from datetime import datetime
from decimal import Decimal

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.utils import timezone

from fleetadmin.deployment import pod_prefix
from fleetadmin.leases import TaskLeased
from pods.poolconfig import PoolConfigError, parse_config


class PoolQuerySet(models.QuerySet):
    def open_to(self, user) -> PoolQuerySet:
        """The pools ``user`` may submit jobs to: every pool for staff and for the command line
        (``None``: whoever runs the deployment); for others, the pools not for staff only whose
        groups, if they have any, include one of theirs."""
        if user is None or user.is_staff or user.is_superuser:
            return self.all()
        groups = list(user.groups.values_list("pk", flat=True)) if user.is_authenticated else []
        return self.filter(staff_only=False).filter(models.Q(groups=None) | models.Q(groups__in=groups)).distinct()


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
    # Issue 39: a pod the control plane has not spoken to for this long stops itself (the pod
    # server exits, and with it the container), so nothing bills while every control-plane
    # process is gone. Long enough for a worker restart; the passes speak to every pod at a
    # third of it.
    autostop_seconds = models.PositiveIntegerField(
        default=600, validators=[MinValueValidator(10), MaxValueValidator(7 * 24 * 3600)],
        help_text="a pod the control plane has not spoken to for this long stops itself",
    )  # fmt: skip
    shed_tick_at = models.DateTimeField(
        null=True, blank=True, editable=False, help_text="a tick is due then: a pod will have idled long enough"
    )
    max_dollars_per_hour = models.DecimalField(
        max_digits=10, decimal_places=2, null=True, blank=True, help_text="budget cap: no boot past this $/h"
    )
    nudged_at = models.DateTimeField(
        null=True, blank=True, editable=False, help_text="a nudged tick was queued then and has not started yet"
    )
    config = models.JSONField(default=dict, blank=True, help_text="provider settings (candidates, image, env)")
    # The cascade (issue 26): a page this pool reads below the threshold is read again there, once.
    escalation_pool = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.PROTECT, related_name="escalated_from_pools",
        help_text="pages read here below the escalation threshold are read again in this pool",
    )  # fmt: skip
    escalation_threshold = models.FloatField(
        null=True, blank=True, validators=[MinValueValidator(0), MaxValueValidator(100)],
        help_text="a page confidence (0-100) below which a page is escalated",
    )  # fmt: skip
    staff_only = models.BooleanField(default=False, help_text="only staff may submit jobs to this pool")
    groups = models.ManyToManyField(
        "auth.Group", blank=True, related_name="pools",
        help_text="if any: only their members (and staff) may submit jobs to this pool",
    )  # fmt: skip
    created_at = models.DateTimeField(auto_now_add=True)

    objects = PoolQuerySet.as_manager()

    class Meta:
        ordering = ["key"]

    def __str__(self) -> str:
        return self.key

    def clean(self) -> None:
        from django.core.exceptions import ValidationError

        if self.min_pods > self.max_pods:
            raise ValidationError({"min_pods": "the warm floor cannot be above max pods"})
        if (self.escalation_pool_id is None) != (self.escalation_threshold is None):
            raise ValidationError({"escalation_threshold": "an escalation pool and a threshold go together"})
        if self.escalation_pool_id is not None and self.escalation_pool_id == self.pk:
            raise ValidationError({"escalation_pool": "a pool cannot escalate to itself"})
        if self.escalation_pool_id is not None:
            groups = getattr(self, "groups_to_save", None)  # the admin form's, before it saves them
            if groups is None:
                groups = set(self.groups.values_list("pk", flat=True)) if self.pk else set()
            if why := self.less_open(self.escalation_pool, staff_only=self.staff_only, groups=groups):
                raise ValidationError({"escalation_pool": why})
        try:
            parse_config(self.provider, self.config)
        except PoolConfigError as exc:
            raise ValidationError({"config": str(exc)}) from None

    @staticmethod
    def less_open(target: Pool, *, staff_only: bool, groups: set[int]) -> str:
        """Why ``target`` is open to fewer users than a pool that is ``staff_only`` and kept to
        ``groups`` (their ids; none: everyone), or "" when it is open to all of them: a pool
        escalates only to one open to every user of its own (issue 38), or their pages would
        keep their first reading."""
        if target.staff_only and not staff_only:
            return f"pool {target.key!r} is kept to staff: others' pages here could not escalate to it"
        kept_to = set(target.groups.values_list("pk", flat=True))
        if kept_to and not staff_only and (not groups or not groups <= kept_to):
            return f"pool {target.key!r} is kept to groups that not every user of this pool is in"
        return ""


def new_pod_token() -> str:
    return secrets.token_urlsafe(32)


class PodQuerySet(models.QuerySet):
    def alive(self) -> PodQuerySet:
        return self.filter(state__in=Pod.ALIVE_STATES)

    def reachable_here(self) -> PodQuerySet:
        """Pods this host can reach and look after: every host's, and this host's own local pods
        (another host's local pods are only its own to dispatch to, boot and terminate)."""
        return self.filter(host__in=("", settings.HOST_ID))

    def ready(self) -> PodQuerySet:
        return self.filter(state=Pod.State.READY)


class Pod(TaskLeased):
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

    class BootStage(models.TextChoices):
        CREATE = "create", "finding a candidate with capacity"
        CREATING = "creating", "a create call is out (a step killed here adopts the pod by its name)"
        RUNNING = "running", "created; waiting until it runs with its port exposed"
        MODEL = "model", "running; waiting until its model answers"

    ALIVE_STATES = (State.BOOTING, State.READY, State.DRAINING)
    ENDED_STATES = (State.TERMINATED, State.FAILED, State.LOST)

    pool = models.ForeignKey(Pool, on_delete=models.PROTECT, related_name="pods")
    name = models.CharField(max_length=120, unique=True)
    provider_id = models.CharField(max_length=120, blank=True, db_index=True)
    # A local pod's host (settings.HOST_ID): only that host reaches it (loopback) and sees its process.
    # Blank for pods that every host reaches (RunPod's), and for local pods from before hosts.
    host = models.CharField(max_length=100, blank=True, help_text="the host whose local provider runs it")
    state = models.CharField(max_length=20, choices=State.choices, default=State.BOOTING, db_index=True)
    reason = models.CharField(max_length=20, choices=Reason.choices, default=Reason.DEMAND)
    base_url = models.CharField(max_length=200, blank=True)
    lanes = models.PositiveIntegerField(default=1)
    gpu_type = models.CharField(max_length=100, blank=True)
    cloud_type = models.CharField(max_length=20, blank=True)
    data_center = models.CharField(max_length=40, blank=True)  # the candidate's: part of its key
    # Where the provider placed it, when it said: a candidate may name no data centre and let
    # RunPod choose. Apart from data_center, which names the candidate a preemption blocks.
    placed_in = models.CharField(max_length=40, blank=True, help_text="the data centre the provider placed it in")
    cost_per_hr = models.DecimalField(max_digits=10, decimal_places=4, default=Decimal("0"))
    interruptible = models.BooleanField(default=False, help_text="rented at a bid: the provider may preempt it")
    preempted_at = models.DateTimeField(null=True, blank=True, help_text="when the provider took it back")
    on_demand_only = models.BooleanField(
        default=False,
        help_text="booted for a deadline that interruptible pods would put at risk: never rented at a bid",
    )
    created_at = models.DateTimeField(default=timezone.now)
    billed_from = models.DateTimeField(null=True, blank=True, help_text="when the provider created it")
    ready_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    last_busy_at = models.DateTimeField(null=True, blank=True)
    cancel_requested_at = models.DateTimeField(
        null=True, blank=True, help_text="a shed asked this anticipatory boot to stop before it joins"
    )
    engine = models.JSONField(default=dict, blank=True, help_text="what the pod's /v1/models said when it joined")
    error = models.TextField(blank=True)
    # Boots and releases are rows that passes advance one short step at a time (pods/services/passes.py).
    boot_stage = models.CharField(
        max_length=10, choices=BootStage.choices, blank=True, help_text="where a booting pod is in its boot"
    )
    stage_started_at = models.DateTimeField(null=True, blank=True, help_text="when it entered its boot stage")
    stage_steps = models.PositiveIntegerField(
        default=0, help_text="steps taken in its boot stage (the model stage asks the provider one in a few)"
    )
    step_at = models.DateTimeField(
        null=True, blank=True, db_index=True,
        help_text="when a pass next looks at it: a booting pod's next step, an ended pod's next terminate",
    )  # fmt: skip
    autostop_seconds = models.PositiveIntegerField(
        null=True, blank=True, help_text="the autostop interval it was booted with (its pool's then)"
    )
    contacted_at = models.DateTimeField(
        null=True, blank=True, help_text="when the control plane last spoke to the pod (its autostop counts from there)"
    )
    keepalive_at = models.DateTimeField(
        null=True, blank=True, db_index=True, help_text="when a pass next speaks to it, so it does not stop itself"
    )
    terminate_pending = models.BooleanField(
        default=False, help_text="ended here; the provider has not confirmed its terminate yet"
    )
    # The pod's bearer token: made with the row, passed in the pod's environment (POD_TOKEN), sent
    # with every request to it. Never shown: not in pods/serializers.py's pod_dict, logs, errors, pages or /metrics.
    # Empty for a pod booted before pods had tokens (it runs open, on loopback only).
    token = models.CharField(max_length=64, blank=True, default=new_pod_token, editable=False)

    objects = PodQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]
        # What the dashboard reads each second of the pods that ended (pods.charts.billed, the
        # failed pods): the last hour's or the day's, not every pod ever rented.
        indexes = [models.Index(fields=["ended_at"], name="pod_ended_idx")]

    def __str__(self) -> str:
        return self.name

    @property
    def is_alive(self) -> bool:
        return self.state in self.ALIVE_STATES

    @property
    def location(self) -> str:
        """The data centre it runs in: where the provider placed it, else the one it was asked for."""
        return self.placed_in or self.data_center

    def spend(self, *, at: datetime | None = None) -> Decimal:
        """Dollars billed so far: from the provider's create until the pod ended (or now)."""
        if self.billed_from is None:
            return Decimal("0.0000")
        end = self.ended_at or at or timezone.now()
        seconds = max(0.0, (end - self.billed_from).total_seconds())
        return (self.cost_per_hr * Decimal(seconds) / Decimal(3600)).quantize(Decimal("0.0001"))

    @property
    def autostop(self) -> int:
        """Seconds it stops itself after, unspoken to: the interval it was booted with (a pool
        changed since does not change a running pod's), else its pool's."""
        return self.autostop_seconds or self.pool.autostop_seconds

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


def pod_name(pool: Pool, suffix: str) -> str:
    """Pods carry the deployment's prefix and pool key so reconcile can find them."""
    return f"{pod_prefix()}-{pool.key}-{suffix}"


class CapacityVerdict(models.Model):
    """What a candidate (provider, GPU type, cloud, data centre) said last, shared by every booter.

    "No capacity" blocks the candidate for everybody until ``blocked_until``;
    ``probing_until`` lets one boot at a time try it (the lock expires if its
    holder dies). A create that succeeded sets ``open_until``: while it lasts the
    candidate is known to have capacity, and boots create on it side by side,
    ``open_slots`` at a time (doubling while creates succeed), until one is refused.
    """

    key = models.CharField(max_length=300, unique=True)
    blocked_until = models.DateTimeField(null=True, blank=True)
    probing_until = models.DateTimeField(null=True, blank=True)
    open_until = models.DateTimeField(null=True, blank=True)
    open_slots = models.PositiveIntegerField(default=0)
    reason = models.CharField(max_length=500, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["key"]

    def __str__(self) -> str:
        return self.key


class BootAttempt(models.Model):
    """One create call at a provider: the probe log."""

    class Outcome(models.TextChoices):
        CREATED = "created"
        NO_CAPACITY = "no_capacity"
        UNKNOWN_OFFER = "unknown_offer"
        AUTH_FAILED = "auth_failed"
        TRANSIENT = "transient"
        INVALID = "invalid"
        REFUSED = "refused"  # a refusal the provider's words do not sort (BadRequest): the walk goes on
        BALANCE = "balance"  # the account's balance or spending limit refused it

    pod = models.ForeignKey(Pod, on_delete=models.CASCADE, related_name="boot_attempts")
    candidate = models.CharField(max_length=300)
    outcome = models.CharField(max_length=20, choices=Outcome.choices)
    error = models.TextField(blank=True)
    seconds = models.FloatField(default=0)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-created_at"]
        # The dashboard's recent attempts and failures walk it down each second (pods.dashboard).
        indexes = [models.Index(fields=["created_at", "id"], name="bootattempt_created_idx")]

    def __str__(self) -> str:
        return f"{self.candidate}: {self.outcome}"

    @classmethod
    def record(cls, *, pod: Pod, candidate: str, outcome: str, error: str = "", seconds: float = 0.0) -> BootAttempt:
        """Log one create call, and count it in its pool's tally by outcome (what /metrics reads
        instead of every attempt ever made)."""
        attempt = cls.objects.create(pod=pod, candidate=candidate, outcome=outcome, error=error, seconds=seconds)
        BootAttemptTally.objects.get_or_create(pool_id=pod.pool_id, outcome=outcome)
        BootAttemptTally.objects.filter(pool_id=pod.pool_id, outcome=outcome).update(n=models.F("n") + 1)
        return attempt


class BootAttemptTally(models.Model):
    """Create calls per pool and outcome, counted as each is logged (``BootAttempt.record``)."""

    pool = models.ForeignKey(Pool, on_delete=models.CASCADE, related_name="boot_attempt_tallies")
    outcome = models.CharField(max_length=20)
    n = models.PositiveBigIntegerField(default=0)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["pool", "outcome"], name="boot_attempt_tally_unique")]

    def __str__(self) -> str:
        return f"pool {self.pool_id} {self.outcome}: {self.n}"


class PriceCatalogue(models.Model):
    """The provider's GPU price list, fetched at most once a minute per deployment."""

    provider = models.CharField(max_length=20, unique=True)
    offers = models.JSONField(default=list)
    fetched_at = models.DateTimeField(null=True, blank=True)
    fetching_until = models.DateTimeField(null=True, blank=True)
    fetches = models.PositiveIntegerField(default=0)
    last_error = models.TextField(blank=True)

    def __str__(self) -> str:
        return f"{self.provider} prices"


class Alert(models.Model):
    """Something a person should know: auth refused, dispatch stalled, a budget reached."""

    class Kind(models.TextChoices):
        AUTH = "auth", "provider refused our credentials"
        CONFIG = "config", "pool configuration refused by the provider"
        BOOT = "boot", "boot failure"
        STALL = "stall", "dispatch stalled"
        BUDGET = "budget", "budget cap reached"
        DEADLINE = "deadline", "a job's deadline cannot be met"
        BALANCE = "balance", "the provider account's balance or spending limit refused a pod"

    pool = models.ForeignKey(Pool, null=True, blank=True, on_delete=models.CASCADE, related_name="alerts")
    kind = models.CharField(max_length=20, choices=Kind.choices)
    message = models.TextField()
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)
    count = models.PositiveIntegerField(default=1)
    resolved_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-updated_at"]

    def __str__(self) -> str:
        return f"{self.kind}: {self.message[:60]}"

    @classmethod
    def raise_(cls, *, pool: Pool | None, kind: str, message: str) -> Alert:
        """Open an alert, or count one more of the same open alert."""
        now = timezone.now()
        alert = cls.objects.filter(pool=pool, kind=kind, resolved_at__isnull=True).first()
        if alert is None:
            return cls.objects.create(pool=pool, kind=kind, message=message, created_at=now, updated_at=now)
        cls.objects.filter(pk=alert.pk).update(message=message, updated_at=now, count=models.F("count") + 1)
        return alert

    @classmethod
    def resolve(cls, *, pool: Pool | None, kind: str) -> int:
        return cls.objects.filter(pool=pool, kind=kind, resolved_at__isnull=True).update(resolved_at=timezone.now())


class PoolPodTally(models.Model):
    """The pool's ended pods, counted by how they ended, and what they were billed: added to in
    the transaction that ends each pod (``pod_end``), so that /metrics reads the live pods and
    this row, never every pod ever rented."""

    pool = models.OneToOneField(Pool, on_delete=models.CASCADE, primary_key=True, related_name="pod_tally")
    terminated = models.PositiveIntegerField(default=0)
    failed = models.PositiveIntegerField(default=0)
    lost = models.PositiveIntegerField(default=0)
    dollars = models.DecimalField(max_digits=14, decimal_places=4, default=Decimal("0"))

    ENDED_STATES = ("terminated", "failed", "lost")

    def __str__(self) -> str:
        return f"ended pods of pool {self.pool_id}"

    @classmethod
    def add(cls, *, pod: Pod) -> None:
        """Count one pod that just ended (in its state) and its whole bill."""
        if pod.state not in cls.ENDED_STATES:
            return
        cls.objects.get_or_create(pool_id=pod.pool_id)
        cls.objects.filter(pool_id=pod.pool_id).update(
            **{pod.state: models.F(pod.state) + 1}, dollars=models.F("dollars") + pod.spend()
        )


class SpendEntry(models.Model):
    """Dollars a pod cost, written when it ends: a share per job it served (by busy time)
    and the rest, its idle and boot time, to the pool alone."""

    pod = models.ForeignKey(Pod, on_delete=models.CASCADE, related_name="spend_entries")
    pool = models.ForeignKey(Pool, on_delete=models.CASCADE, related_name="spend_entries")
    job = models.ForeignKey(
        "ocrjobs.Job", null=True, blank=True, on_delete=models.SET_NULL, related_name="spend_entries"
    )
    dollars = models.DecimalField(max_digits=12, decimal_places=6)
    seconds = models.FloatField(help_text="billed seconds this entry covers")
    at = models.DateTimeField(default=timezone.now, db_index=True)

    class Meta:
        ordering = ["-at"]

    def __str__(self) -> str:
        return f"{self.pod} ${self.dollars}"


class PassLease(TaskLeased):
    """One row per kind of pass: at most one pass of that kind is queued or running at a time,
    deployment-wide (its task lease), and a pass whose task the broker lost is sent again."""

    name = models.CharField(max_length=40, unique=True)

    def __str__(self) -> str:
        return self.name


class ScaleRequest(models.Model):
    class State(models.TextChoices):
        PENDING = "pending"
        DONE = "done"
        FAILED = "failed"

    pool = models.ForeignKey(Pool, on_delete=models.CASCADE, related_name="scale_requests")
    target = models.PositiveIntegerField()
    state = models.CharField(max_length=10, choices=State.choices, default=State.PENDING, db_index=True)
    result = models.JSONField(default=dict, blank=True)
    requested_by = models.CharField(max_length=150, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    deadline_at = models.DateTimeField(null=True, blank=True, help_text="failed if not at its target by then")
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"scale {self.pool} to {self.target}"


class AuditEntry(models.Model):
    """Who released or terminated a pod, or cancelled, retried or rebuilt a job, by which door,
    and when: written by the service that does the action (pods/audit.py), whichever door asked.
    Actions the system takes on its own (a shed, a drain) are not people's and are not recorded."""

    class Action(models.TextChoices):
        RELEASE = "release"
        TERMINATE = "terminate"
        CANCEL = "cancel"
        RETRY = "retry"
        REBUILD = "rebuild"

    class Door(models.TextChoices):
        API = "api"
        PAGE = "page"
        ADMIN = "admin"
        CLI = "cli"

    at = models.DateTimeField(default=timezone.now)
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    actor_name = models.CharField(max_length=150, help_text="kept when the user is deleted")
    action = models.CharField(max_length=20, choices=Action.choices)
    door = models.CharField(max_length=10, choices=Door.choices)
    pod = models.ForeignKey(Pod, null=True, blank=True, on_delete=models.SET_NULL, related_name="audit_entries")
    job = models.ForeignKey(
        "ocrjobs.Job", null=True, blank=True, on_delete=models.CASCADE, related_name="audit_entries"
    )
    detail = models.CharField(max_length=500, blank=True, help_text="what the action did, in words")

    class Meta:
        ordering = ["-at", "-id"]
        indexes = [
            models.Index(fields=["job", "at"], name="audit_job_at_idx"),
            models.Index(fields=["pod", "at"], name="audit_pod_at_idx"),
        ]

    def __str__(self) -> str:
        target = f"pod {self.pod_id}" if self.pod_id else f"job {self.job_id}"
        return f"{self.actor_name} {self.action} {target} ({self.door})"
