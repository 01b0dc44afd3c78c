"""The jobs' models: Job, Document, Page (a page's claim, result and cascade stages), Dispatcher,
webhook deliveries and secrets, submission keys, searchable PDFs.

Length: one models module per app, as Django finds them; a package of them would only part the
Page from the queries and tallies that read it beside it.
"""

from __future__ import annotations

import json
from pathlib import Path

from django.conf import settings
from django.db import models
from django.db.models import Count, F, Q
from django.urls import reverse
from django.utils import timezone

from fleetadmin.leases import TaskLeased
from ocrjobs.results import StoredResult
from ocrjobs.storage import documents
from pods.models import Pod, Pool


class Job(models.Model):
    class Status(models.TextChoices):
        QUEUED = "queued"  # documents are being split into pages
        RUNNING = "running"
        DONE = "done"  # every page has text
        PARTIAL = "partial"  # some pages or documents failed, the rest has text
        FAILED = "failed"  # nothing could be read
        CANCELLED = "cancelled"

    class Priority(models.TextChoices):
        FASTEST = "fastest", "fastest: as many pods as its pages can use, within max pods"
        BALANCED = "balanced", "balanced: the pool's cost-aware sizing"
        CHEAPEST = "cheapest", "cheapest: the fewest pods, whatever it takes"

    class TextMode(models.TextChoices):
        # What becomes of a PDF page that already has text (issue 40), as OCRmyPDF names it.
        SKIP = "skip", "skip: a page with a usable text layer keeps it, no OCR (--skip-text)"
        REDO = "redo", "redo: its invisible text layer replaced by ours, visible text kept (--redo-ocr)"
        FORCE = "force", "force: every page read, the searchable PDF carries our text only (--force-ocr)"

    FINISHED = (Status.DONE, Status.PARTIAL, Status.FAILED, Status.CANCELLED)

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    pool = models.ForeignKey(Pool, on_delete=models.PROTECT, related_name="jobs")
    status = models.CharField(max_length=20, choices=Status.choices, default=Status.QUEUED, db_index=True)
    languages = models.CharField(max_length=100, default="eng")
    text_mode = models.CharField(max_length=5, choices=TextMode.choices, default=TextMode.REDO)
    searchable_pdf = models.BooleanField(
        default=False, help_text="each document's searchable PDF is built when the job ends (else when first asked for)"
    )
    max_dollars = models.DecimalField(
        max_digits=10, decimal_places=2, null=True, blank=True, help_text="budget cap: its pages boot no pod past it"
    )
    deadline = models.DateTimeField(null=True, blank=True, help_text="the scaler sizes the pool to finish by then")
    priority = models.CharField(max_length=10, choices=Priority.choices, default=Priority.BALANCED)
    forecast = models.JSONField(default=dict, blank=True, help_text="pods, minutes and dollars foreseen at submission")
    callback_url = models.URLField(max_length=2000, blank=True, help_text="posted a signed event when the job ends")
    # Each label between commas (",invoices,2026-q4,"): the job list finds a label as ",label,".
    labels = models.CharField(max_length=500, blank=True, default="", help_text="its labels, between commas")
    created_at = models.DateTimeField(default=timezone.now)
    # When it last started: submitted, or retried. Its owner's daily budget counts it from then.
    started_at = models.DateTimeField(default=timezone.now)
    finished_at = models.DateTimeField(null=True, blank=True)
    # What of this job's pages is already in its pool's PoolPageTally (added when it finished):
    # /metrics counts the rest live, from the unfinished jobs' pages only.
    tallied_done = models.PositiveIntegerField(default=0, editable=False)
    tallied_failed = models.PositiveIntegerField(default=0, editable=False)

    class Meta:
        ordering = ["-created_at"]
        # The dashboard's newest jobs, active and finished, everybody's and each owner's, walk
        # these down: a few rows each second however many jobs were ever made
        # (ocrjobs.selectors.jobs_for_dashboard).
        indexes = [
            models.Index(fields=["created_at", "id"], name="job_created_idx"),
            models.Index(fields=["status", "created_at", "id"], name="job_status_created_idx"),
            models.Index(fields=["owner", "created_at", "id"], name="job_owner_created_idx"),
            models.Index(fields=["owner", "status", "created_at", "id"], name="job_owner_status_created_idx"),
            # The owner's jobs of the budget's window (ocrjobs.services.budgets.budget_left).
            models.Index(fields=["owner", "started_at"], name="job_owner_started_idx"),
        ]

    def __str__(self) -> str:
        return f"job {self.pk}"

    def get_absolute_url(self) -> str:
        return reverse("jobs-detail", args=[self.pk])

    @property
    def is_finished(self) -> bool:
        return self.status in self.FINISHED

    # "warnings": pages done whose reading carries a warning (unusable as it stands: read at a
    # confidence under OCR_WARN_CONFIDENCE_BELOW, its orientation unknown, rendered below its DPI).
    PAGE_COUNTS = ("total", "pending", "running", "done", "failed", "cancelled", "warnings")

    def page_counts(self) -> dict[str, int]:
        counts = self.pages.aggregate(
            total=Count("id"),
            **{status: Count("id", filter=q) for status, q in page_status_filters().items()},
            warnings=Count("id", filter=Q(status=Page.Status.DONE, warnings__gt=0)),
        )
        return counts

    @property
    def label_list(self) -> list[str]:
        return [label for label in self.labels.split(",") if label]

    @staticmethod
    def labels_stored(labels: list[str]) -> str:
        return f",{','.join(labels)}," if labels else ""


class PoolPageTally(models.Model):
    """Pages done and failed in the pool's finished jobs, maintained as each job finishes (in the
    transaction that finishes it), so that /metrics never counts over every page ever made."""

    pool = models.OneToOneField(Pool, on_delete=models.CASCADE, primary_key=True, related_name="page_tally")
    done = models.PositiveBigIntegerField(default=0)
    failed = models.PositiveBigIntegerField(default=0)

    def __str__(self) -> str:
        return f"{self.pool_id}: {self.done} done, {self.failed} failed"


class WebhookSecret(models.Model):
    """The key a user's job events are signed with (HMAC-SHA256); made on first use."""

    owner = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="webhook_secret")
    secret = models.CharField(max_length=80)
    created_at = models.DateTimeField(default=timezone.now)
    # After a rotation the secret before it still signs events (a second signature) until then.
    previous_secret = models.CharField(max_length=80, blank=True, default="")
    previous_until = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"webhook secret of {self.owner_id}"


class WebhookDeliveryQuerySet(models.QuerySet):
    def due(self, *, now) -> WebhookDeliveryQuerySet:
        """Pending, its next attempt's time come, and no attempt in flight."""
        in_flight = Q(task_lease_until__gte=now) & ~Q(task_lease_token="")
        return self.filter(state=WebhookDelivery.State.PENDING, next_attempt_at__lte=now).exclude(in_flight)

    def in_flight(self, *, now) -> WebhookDeliveryQuerySet:
        """Attempts sent to a worker or being made: what the cap on them counts."""
        return self.filter(state=WebhookDelivery.State.PENDING, task_lease_until__gte=now).exclude(task_lease_token="")


class WebhookDelivery(TaskLeased):
    """One event for a job's callback URL, with back-off until it is answered 2xx or a day has gone
    by. Each attempt is a short task of its own (ocrjobs/services/webhooks.py), which a pass only
    sends: a pass never waits on a receiver. The task's lease marks the attempt in flight."""

    class State(models.TextChoices):
        PENDING = "pending"
        DELIVERED = "delivered"
        FAILED = "failed"  # a day of attempts, none answered 2xx

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="webhook_deliveries")
    event = models.CharField(max_length=20, help_text="the job's status: done, partial, failed, cancelled")
    url = models.URLField(max_length=2000)
    body = models.TextField(help_text="the JSON posted, exactly as signed")
    state = models.CharField(max_length=10, choices=State.choices, default=State.PENDING)
    attempts = models.JSONField(default=list, blank=True, help_text="[{at, status or error, seconds}], in order")
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    delivered_at = models.DateTimeField(null=True, blank=True)

    objects = WebhookDeliveryQuerySet.as_manager()

    class Meta:
        ordering = ["id"]
        indexes = [models.Index(fields=["state", "next_attempt_at"], name="webhook_due_idx")]

    def __str__(self) -> str:
        return f"{self.event} of job {self.job_id} to {self.url}"


class SubmissionKey(models.Model):
    """An ``Idempotency-Key`` a user sent with a submission, and the job it made.

    Stored in the job's own transaction: the key exists exactly when its job does. The unique
    constraint settles two requests racing on one key: the second insert fails, its whole
    submission rolls back, and it answers with the first job."""

    TTL = timezone.timedelta(hours=24)

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    key = models.CharField(max_length=255)
    fingerprint = models.CharField(max_length=64, help_text="sha256 of the submission's fields and files")
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="submission_keys")
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["owner", "key"], name="submission_key_unique")]

    def __str__(self) -> str:
        return f"{self.key} -> job {self.job_id}"

    @property
    def expired(self) -> bool:
        return self.created_at < timezone.now() - self.TTL


class Document(TaskLeased):
    class Kind(models.TextChoices):
        PDF = "pdf"
        IMAGE = "image"
        URL = "url", "URL (not fetched yet)"

    class Status(models.TextChoices):
        PENDING = "pending"  # waiting to be split into pages
        SPLIT = "split"
        FAILED = "failed"

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="documents")
    position = models.PositiveIntegerField()
    name = models.CharField(max_length=255)
    kind = models.CharField(max_length=10, choices=Kind.choices)
    source = models.CharField(max_length=500, blank=True, help_text="its name in the documents' storage")
    url = models.URLField(max_length=2000, blank=True, help_text="fetched by a worker, never by the front")
    size_bytes = models.PositiveBigIntegerField()
    # Computed while the bytes stream in (upload, fetch): the name the pods cache it under.
    sha256 = models.CharField(max_length=64, blank=True)
    page_count = models.PositiveIntegerField()
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.PENDING)
    error = models.TextField(blank=True)
    fetch_attempts = models.PositiveSmallIntegerField(
        default=0, help_text="downloads of a URL document started (URL_FETCH_MAX_ATTEMPTS at most)"
    )
    split_at = models.DateTimeField(null=True, blank=True, help_text="its pages made (the job's timeline)")

    class Meta:
        ordering = ["job", "position"]
        constraints = [models.UniqueConstraint(fields=["job", "position"], name="document_position_unique")]

    def __str__(self) -> str:
        return self.name

    @property
    def source_path(self) -> Path:
        """Where the document is on this host's disk: only for a storage on the local filesystem."""
        return Path(documents().path(self.source))

    @property
    def searchable_pdf_or_none(self) -> SearchablePdf | None:
        return getattr(self, "searchable_pdf", None)  # (None when the reverse one-to-one has no row)


def lowest_line_confidence(result) -> float | None:
    """The lowest confidence of a result's lines (``Page.min_line_confidence``): under the viewer's
    threshold, the page has a line to check. A corrected line (it carries ``engine_text``) was
    read by a person: 100. None when no line gives a confidence (the page's own is judged).
    ``result``: a stored result's dict, or a pod's answer as the dispatcher parsed it
    (podserver.answers.PageAnswer, whose lines are PageLine)."""
    lowest = None
    for line in (result.get("lines") if isinstance(result, dict) else result.lines) or []:
        if not isinstance(line, dict):
            line = {**(line.model_extra or {}), "confidence": line.confidence} if hasattr(line, "model_extra") else None
            if line is None:
                continue
        confidence = 100.0 if "engine_text" in line else line.get("confidence")
        if isinstance(confidence, int | float) and not isinstance(confidence, bool):
            lowest = float(confidence) if lowest is None else min(lowest, float(confidence))
    return lowest


def page_status_filters() -> dict[str, Q]:
    """The page counts by status that people are shown: a page runs while it is out at a pod; one
    a dispatcher claimed ahead for a lane (running, no pod yet) waits, as the dashboard's lanes
    count it (``ocrjobs.selectors.pages_at_pods``)."""
    filters = {str(status): Q(status=status) for status in Page.Status}
    filters[str(Page.Status.RUNNING)] = Q(status=Page.Status.RUNNING, pod__isnull=False)
    filters[str(Page.Status.PENDING)] = Q(status=Page.Status.PENDING) | Q(status=Page.Status.RUNNING, pod__isnull=True)
    return filters


class PageQuerySet(models.QuerySet):
    def waiting(self) -> PageQuerySet:
        """Pages a dispatcher may claim: never started, or whose claim expired; never a page of a
        cancelled job, even one left pending (a split that saved a batch as the job was cancelled)."""
        now = timezone.now()
        waiting = Q(status=Page.Status.PENDING) | Q(status=Page.Status.RUNNING, claim_expires_at__lt=now)
        return self.filter(waiting).exclude(job__status=Job.Status.CANCELLED)


# Pending pages are claimed a job at a time, and within a job in strips of this many page numbers:
# the first strip of every document, then the second... So a dispatcher's queue holds pages of many
# of a job's documents at once, and each pod keeps to one of them. Claimed by id (a document after
# another), the queue held one or two documents and every pod got a copy of each long document:
# 2,968 copies (1.1 GB) for 14 documents of 3,000 pages on 256 pods (bench/dispatch.py). Twice a
# pod's 8 lanes, so that a pod's lanes share a strip. Changing it needs a migration (the index).
CLAIM_STRIP_PAGES = 16


class ClaimStrip(models.Func):
    """A page's strip of ``pages`` page numbers, (number - 1) / pages, the constants written into the
    statement: as parameters, SQLite's planner did not match them with the index's expression and
    sorted every pending page at each claim. ``pages`` is in the index's definition, so a change to
    it makes a migration."""

    template = "((%(expressions)s - 1) / %(pages)d)"
    output_field = models.IntegerField()

    def __init__(self, expression, *, pages: int):
        super().__init__(expression, pages=int(pages))


def claim_order() -> tuple:
    """The order in which a pool's pending pages are claimed (page_claim_order_idx's columns)."""
    return (F("job_id"), ClaimStrip("number", pages=CLAIM_STRIP_PAGES), F("id"))


class Page(models.Model):
    class Status(models.TextChoices):
        PENDING = "pending"
        RUNNING = "running"
        DONE = "done"
        FAILED = "failed"
        CANCELLED = "cancelled"

    FINISHED = (Status.DONE, Status.FAILED, Status.CANCELLED)

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="pages")
    # No index of its own: page_number_unique begins with it (every index is written again whenever a
    # page's row is: a claim, its pod, its result).
    document = models.ForeignKey(Document, on_delete=models.CASCADE, related_name="pages", db_index=False)
    # Denormalised from the job so that a dispatcher's claim reads one index.
    pool = models.ForeignKey(Pool, on_delete=models.PROTECT, related_name="pages")
    number = models.PositiveIntegerField()  # 1-based: the pod renders it from its document
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    claim_token = models.CharField(max_length=40, blank=True)
    claim_expires_at = models.DateTimeField(null=True, blank=True)
    pod = models.ForeignKey(Pod, null=True, blank=True, on_delete=models.SET_NULL, related_name="pages")
    # A failed attempt on an interruptible pod that the provider then preempted is given back (the
    # page did nothing wrong). The pod of the page's last failed attempt stays here until then, so
    # that the attempt is given back once even after the page was claimed again: while a newer claim
    # is out, ``attempts`` names that claim and is never changed, so the attempt goes to
    # ``attempts_given_back`` instead, which the cap on attempts subtracts.
    failed_on_pod = models.ForeignKey(Pod, null=True, blank=True, on_delete=models.SET_NULL, related_name="+",
                                      db_index=False)  # fmt: skip
    attempts_given_back = models.PositiveSmallIntegerField(default=0)
    # The result itself (JSON text), not a file: any host serves it (docs/architecture.md, "Storage").
    result = models.TextField(blank=True, help_text="the pod's answer as JSON text")
    confidence = models.FloatField(null=True, blank=True)
    # Its lines' lowest confidence (lowest_line_confidence): a page whose own confidence is fine may
    # hold lines to check (issue 42: 28 lines under 80 in a job whose pages were all over 80).
    min_line_confidence = models.FloatField(null=True, blank=True, help_text="its lines' lowest confidence")
    seconds = models.FloatField(null=True, blank=True, help_text="time the pod took for the page that was stored")
    # A page read but not to be trusted as it is (issue 40): its warnings are in its result
    # ("warnings"), counted here so that a job's count of pages with warnings is one aggregate.
    warnings = models.PositiveSmallIntegerField(default=0, help_text="warnings of its stored result")
    error = models.TextField(blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    # The cascade (issue 26): a page read below its pool's escalation threshold moves to the
    # escalation pool (``pool``) in the UPDATE that would have stored it, its first reading kept
    # here. ``escalated_from`` set: escalated (at most once, never again from the second pool).
    escalated_from = models.ForeignKey(Pool, null=True, blank=True, on_delete=models.PROTECT, related_name="+",
                                       db_index=False)  # fmt: skip
    escalated_at = models.DateTimeField(null=True, blank=True)
    first_result = models.TextField(blank=True, help_text="the first pool's answer, as JSON text")
    first_confidence = models.FloatField(null=True, blank=True)
    first_pod = models.ForeignKey(Pod, null=True, blank=True, on_delete=models.SET_NULL, related_name="+",
                                  db_index=False)  # fmt: skip
    first_seconds = models.FloatField(null=True, blank=True, help_text="time the first pool's pod took")

    objects = PageQuerySet.as_manager()

    class Meta:
        # By id (pages are made in document and page order): an ordering on the document's
        # position made every query of pages, counts included, join the documents.
        ordering = ["id"]
        constraints = [
            models.UniqueConstraint(fields=["document", "number"], name="page_number_unique"),
            # A claim is only ever on a running page: every change away from running clears it. The
            # guarded UPDATEs (services/pages.py) ask for the token alone, on this guarantee.
            models.CheckConstraint(condition=Q(claim_token="") | Q(status="running"), name="page_claim_only_running"),
        ]
        indexes = [
            # status first: also the in-flight count of every pool at once (status) reads only its range
            models.Index(fields=["status", "pool", "claim_expires_at"], name="page_claim_idx"),
            # A pool's pending pages in the order they are claimed (claim_order), without sorting them all
            # at each claim. Only pending pages are in it: a page written as it is claimed, run and
            # stored writes nothing to it.
            models.Index(F("pool"), *claim_order(), name="page_claim_order_idx", condition=Q(status="pending")),
            models.Index(fields=["job", "status", "confidence"], name="page_job_status_conf_idx"),  # to-check too
            models.Index(fields=["job", "min_line_confidence"], name="page_job_min_line_conf_idx"),  # lines to check
            # pages done in the last minute (status, dashboard charts): a range, not a scan of every page ever done
            models.Index(fields=["status", "finished_at"], name="page_status_finished_idx"),
            # A pool's last escalations (the forecast's share escalated). Partial, as the two below: a
            # column that few pages set is indexed only where it is set. The pages that do not set it
            # write nothing to these indexes, and a guarded UPDATE's "escalated_from_id IS NULL" has no
            # index to read every page through (services/pages.py _guarded_update).
            models.Index(
                fields=["escalated_from", "escalated_at"],
                name="page_escalated_idx",
                condition=Q(escalated_from__isnull=False),
            ),
            # a job's pages escalated (its page), without reading every page escalated
            models.Index(fields=["job"], name="page_job_escalated_idx", condition=Q(escalated_from__isnull=False)),
            # a pod's first stages (spend), a pod's failed attempts given back (preemption)
            models.Index(fields=["first_pod"], name="page_first_pod_idx", condition=Q(first_pod__isnull=False)),
            models.Index(
                fields=["failed_on_pod"], name="page_failed_on_pod_idx", condition=Q(failed_on_pod__isnull=False)
            ),
        ]

    def __str__(self) -> str:
        return f"{self.document.name} p{self.number}"

    @staticmethod
    def state_of(status: str, attempts: int, escalated_from_id: int | None) -> str:
        """What the viewer shows of a page that may change while it is on screen: the job page
        reports it for each page it holds, and the live push sends those that moved (ocrjobs/live.py)."""
        return f"{status}:{attempts}:{int(escalated_from_id is not None)}"

    @property
    def live_state(self) -> str:
        return self.state_of(self.status, self.attempts, self.escalated_from_id)

    def read_result(self) -> dict | None:
        if not self.result:
            return None
        return json.loads(self.result)

    def to_record(self) -> dict:
        """One line of result.jsonl. ``dpi``, ``width`` and ``height`` are as the pod reported them:
        the DPI a PDF's page was rendered at (None for an image, read as it is) and the pixel size
        it read, which each line's ``bbox`` is in."""
        result = StoredResult.from_json(self.result) or StoredResult()
        record = {
            "document": self.document.name,
            "document_id": self.document_id,
            "page": self.number,
            "status": self.status,
            "text": result.text,
            "lines": result.lines,
            "confidence": result.confidence,
            "width": result.width,
            "height": result.height,
            "dpi": result.dpi,
            "rotation": result.rotation,
            "skew": result.skew,
            "warnings": result.warnings,
            "error": self.error,
        }
        if result.engine_text is not None:  # corrected lines (LineCorrection): each keeps its engine_text too
            record.update(engine_text=result.engine_text, corrected_lines=result.corrected_lines)
        if result.cascade is not None:  # a page of a pool that escalates: each stage's engine and confidence
            record.update(engine=result.engine, escalated=result.escalated, cascade=result.cascade)
        return record


class DispatcherQuerySet(models.QuerySet):
    def live(self) -> DispatcherQuerySet:
        fresh = timezone.now() - timezone.timedelta(seconds=settings.DISPATCHER_STALE_SECONDS)
        return self.filter(ended_at__isnull=True, heartbeat_at__gte=fresh)


class Dispatcher(models.Model):
    """One running dispatch loop. Its heartbeat says it is alive; a silent one is replaced."""

    pool = models.ForeignKey(Pool, on_delete=models.CASCADE, related_name="dispatchers")
    token = models.CharField(max_length=40, unique=True)
    host = models.CharField(max_length=100)
    pid = models.PositiveIntegerField()
    started_at = models.DateTimeField(default=timezone.now)
    heartbeat_at = models.DateTimeField(default=timezone.now)
    ended_at = models.DateTimeField(null=True, blank=True)
    pages_done = models.PositiveIntegerField(default=0)
    pages_failed = models.PositiveIntegerField(default=0)
    note = models.CharField(max_length=200, blank=True, help_text="why it has no lane, when it has none")

    objects = DispatcherQuerySet.as_manager()

    class Meta:
        ordering = ["-started_at"]

    def __str__(self) -> str:
        return f"dispatcher {self.pk} ({self.pool.key})"


class SearchablePdf(TaskLeased):
    """A document's searchable PDF (issue 25), built by a worker when the job ends (services/searchable_pdf.py).
    A failed build fails nothing else: it is shown with its error, and the next build tries again.
    Its task holds a lease (fleetadmin/leases.py): a build whose task was lost or whose worker
    died is sent again by the minute's tick (services/recover.py), at most PDF_BUILD_ATTEMPTS times."""

    class Status(models.TextChoices):
        PENDING = "pending"  # asked for (the job's end, a retry's, a rebuild), not built yet
        BUILDING = "building"
        BUILT = "built"
        FAILED = "failed"

    document = models.OneToOneField(Document, on_delete=models.CASCADE, primary_key=True, related_name="searchable_pdf")
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.PENDING)
    name = models.CharField(max_length=500, blank=True, help_text="its name in the documents' storage")
    size_bytes = models.PositiveBigIntegerField(default=0)
    error = models.TextField(blank=True)
    builds = models.PositiveIntegerField(default=0, help_text="builds started")
    attempts = models.PositiveIntegerField(
        default=0, help_text="builds started since one last ended (built or failed): kept across rebuilds"
    )
    generation = models.PositiveIntegerField(default=0, help_text="builds asked for: the last one asked stores")
    pages_missing = models.PositiveIntegerField(default=0, help_text="pages without text: failed, cancelled")
    updated_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"searchable PDF of document {self.document_id}: {self.status}"


class OutputRebuild(models.Model):
    """A rebuild of a job's outputs that its owner asked for: what bounds the rebuilds one user may
    ask for in an hour (OUTPUT_REBUILDS_PER_HOUR; ocrjobs.services.outputs.job_outputs_rebuild)."""

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="+")
    documents = models.PositiveIntegerField(default=0)
    at = models.DateTimeField(default=timezone.now)

    class Meta:
        indexes = [models.Index(fields=["owner", "at"], name="output_rebuild_owner_at_idx")]

    def __str__(self) -> str:
        return f"rebuild of job {self.job_id} by {self.owner_id} at {self.at:%Y-%m-%d %H:%M}"


class OwnerTurn(models.Model):
    """When an owner was last given a shared slot of a kind (a URL fetch, a webhook attempt, a
    searchable PDF build): what makes the turns go round (fleetadmin/fairshare.py), the owner
    served longest ago first among those holding as many. ``owner_id`` 0: jobs without an owner."""

    class Kind(models.TextChoices):
        FETCH = "fetch"
        WEBHOOK = "webhook"
        BUILD = "build"

    kind = models.CharField(max_length=16, choices=Kind.choices)
    owner_id = models.PositiveBigIntegerField()
    served_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["kind", "owner_id"], name="owner_turn_kind_owner_uniq")]

    def __str__(self) -> str:
        return f"{self.kind} turn of owner {self.owner_id} at {self.served_at:%Y-%m-%d %H:%M:%S}"


class KeptUpload(models.Model):
    """A file chosen on the job form whose submit was refused, kept for its owner so that the
    form shown again still has it (a browser cannot fill a file input back in). Stored in the
    documents' storage like a document (any front may serve the next submit), until it is
    submitted, dropped on the form, or ``expires_at`` passes (swept by the minute's tick)."""

    KEPT_FOR = timezone.timedelta(hours=1)

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    name = models.CharField(max_length=255)
    source = models.CharField(max_length=500, help_text="the name of the file in the documents' storage")
    size_bytes = models.BigIntegerField()
    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField(db_index=True)

    class Meta:
        indexes = [models.Index(fields=["owner", "expires_at"], name="kept_upload_owner_idx")]

    def __str__(self) -> str:
        return f"{self.name} kept for user {self.owner_id}"


class LineCorrection(models.Model):
    """A person's reading of one line of a page (issue 42, item 7): the page's stored result
    carries it (the outputs read only the result), and this row keeps who wrote it, when, and the
    engine's reading beside it (ocrjobs.services.corrections.line_correct). One a line: a second
    correction replaces the first's text, never the engine's."""

    page = models.ForeignKey(Page, on_delete=models.CASCADE, related_name="corrections")
    line = models.PositiveIntegerField(help_text="the line's index in the page's result (0-based)")
    text = models.TextField(help_text="the corrected text")
    engine_text = models.TextField(help_text="the engine's reading of the line")
    by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["page", "line"], name="line_correction_page_line_uniq")]

    def __str__(self) -> str:
        return f"line {self.line} of page {self.page_id}, corrected by {self.by_id} at {self.at:%Y-%m-%d %H:%M}"
