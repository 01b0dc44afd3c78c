from __future__ import annotations

import json
from pathlib import Path
from typing import IO

from django.conf import settings
from django.db import models
from django.db.models import Count, Q
from django.urls import reverse
from django.utils import timezone

from fleetadmin.leases import TaskLeased
from pods.models import Pod, Pool


class Job(models.Model):
    class Status(models.TextChoices):
        QUEUED = "queued"  # documents are being split into pages
        RUNNING = "running"
        DONE = "done"  # every page has text
        PARTIAL = "partial"  # some pages or documents failed, the rest has text
        FAILED = "failed"  # nothing could be read
        CANCELLED = "cancelled"

    FINISHED = (Status.DONE, Status.PARTIAL, Status.FAILED, Status.CANCELLED)

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    pool = models.ForeignKey(Pool, on_delete=models.PROTECT, related_name="jobs")
    status = models.CharField(max_length=20, choices=Status.choices, default=Status.QUEUED, db_index=True)
    languages = models.CharField(max_length=100, default="eng")
    skip_text_pages = models.BooleanField(default=False, help_text="PDF pages with a text layer keep it, no OCR")
    max_dollars = models.DecimalField(
        max_digits=10, decimal_places=2, null=True, blank=True, help_text="budget cap: its pages boot no pod past it"
    )
    created_at = models.DateTimeField(default=timezone.now)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"job {self.pk}"

    def get_absolute_url(self) -> str:
        return reverse("jobs-detail", args=[self.pk])

    @property
    def is_finished(self) -> bool:
        return self.status in self.FINISHED

    def page_counts(self) -> dict[str, int]:
        counts = self.pages.aggregate(
            total=Count("id"),
            pending=Count("id", filter=Q(status=Page.Status.PENDING)),
            running=Count("id", filter=Q(status=Page.Status.RUNNING)),
            done=Count("id", filter=Q(status=Page.Status.DONE)),
            failed=Count("id", filter=Q(status=Page.Status.FAILED)),
            cancelled=Count("id", filter=Q(status=Page.Status.CANCELLED)),
        )
        return counts

    def to_dict(self) -> dict:
        documents = list(self.documents.all())
        return {
            "id": self.pk,
            "status": self.status,
            "pool": self.pool.key,
            "languages": self.languages,
            "skip_text_pages": self.skip_text_pages,
            "created_at": self.created_at.isoformat(),
            "finished_at": self.finished_at.isoformat() if self.finished_at else None,
            "pages": self.page_counts(),
            "documents": [d.to_dict() for d in documents],
        }


def document_open(source: str) -> IO[bytes]:
    """A stored document's own bytes, by its name in storage (``Document.source``), opened for
    reading. Every reader of a document goes through here: the split, the dispatcher's PUT."""
    return open(settings.MEDIA_ROOT / source, "rb")


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
    source = models.CharField(max_length=500, blank=True, help_text="path under MEDIA_ROOT")
    url = models.URLField(max_length=2000, blank=True, help_text="fetched by a worker, never by the front")
    size_bytes = models.PositiveBigIntegerField()
    # Computed while the bytes stream in (upload, fetch): the name the pods cache it under.
    sha256 = models.CharField(max_length=64, blank=True)
    page_count = models.PositiveIntegerField()
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.PENDING)
    error = models.TextField(blank=True)

    class Meta:
        ordering = ["job", "position"]
        constraints = [models.UniqueConstraint(fields=["job", "position"], name="document_position_unique")]

    def __str__(self) -> str:
        return self.name

    @property
    def source_path(self) -> Path:
        return settings.MEDIA_ROOT / self.source

    def open(self) -> IO[bytes]:
        return document_open(self.source)

    def to_dict(self) -> dict:
        return {
            "id": self.pk,
            "name": self.name,
            "kind": self.kind,
            "url": self.url,
            "size_bytes": self.size_bytes,
            "page_count": self.page_count,
            "status": self.status,
            "error": self.error,
        }


class PageQuerySet(models.QuerySet):
    def waiting(self) -> PageQuerySet:
        """Pages a dispatcher may claim: never started, or whose claim expired; never a page of a
        cancelled job, even one left pending (a split that saved a batch as the job was cancelled)."""
        now = timezone.now()
        waiting = Q(status=Page.Status.PENDING) | Q(status=Page.Status.RUNNING, claim_expires_at__lt=now)
        return self.filter(waiting).exclude(job__status=Job.Status.CANCELLED)


class Page(models.Model):
    class Status(models.TextChoices):
        PENDING = "pending"
        RUNNING = "running"
        DONE = "done"
        FAILED = "failed"
        CANCELLED = "cancelled"

    FINISHED = (Status.DONE, Status.FAILED, Status.CANCELLED)

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="pages")
    document = models.ForeignKey(Document, on_delete=models.CASCADE, related_name="pages")
    # Denormalised from the job so that a dispatcher's claim reads one index.
    pool = models.ForeignKey(Pool, on_delete=models.PROTECT, related_name="pages")
    number = models.PositiveIntegerField()  # 1-based: the pod renders it from its document
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    claim_token = models.CharField(max_length=40, blank=True)
    claim_expires_at = models.DateTimeField(null=True, blank=True)
    pod = models.ForeignKey(Pod, null=True, blank=True, on_delete=models.SET_NULL, related_name="pages")
    result = models.CharField(max_length=500, blank=True, help_text="path under MEDIA_ROOT")
    confidence = models.FloatField(null=True, blank=True)
    seconds = models.FloatField(null=True, blank=True, help_text="time the pod took for the page that was stored")
    error = models.TextField(blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    objects = PageQuerySet.as_manager()

    class Meta:
        # By id (pages are made in document and page order): an ordering on the document's
        # position made every query of pages, counts included, join the documents.
        ordering = ["id"]
        constraints = [models.UniqueConstraint(fields=["document", "number"], name="page_number_unique")]
        indexes = [
            # status first: also the in-flight count of every pool at once (status) reads only its range
            models.Index(fields=["status", "pool", "claim_expires_at"], name="page_claim_idx"),
            models.Index(fields=["job", "status"], name="page_job_status_idx"),
            # pages done in the last minute (status, dashboard charts): a range, not a scan of every page ever done
            models.Index(fields=["status", "finished_at"], name="page_status_finished_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.document.name} p{self.number}"

    def read_result(self) -> dict | None:
        if not self.result:
            return None
        return json.loads((settings.MEDIA_ROOT / self.result).read_text())

    def to_record(self) -> dict:
        """One line of result.jsonl."""
        result = self.read_result() or {}
        return {
            "document": self.document.name,
            "document_id": self.document_id,
            "page": self.number,
            "status": self.status,
            "text": result.get("text", ""),
            "lines": result.get("lines", []),
            "confidence": result.get("confidence"),
            "width": result.get("width"),
            "height": result.get("height"),
            "error": self.error,
        }


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
