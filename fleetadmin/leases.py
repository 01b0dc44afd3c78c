"""Task leases: a row that a worker task works on says so, and until when.

The broker is not trusted to keep a task: on Redis, a task whose worker was
killed with -9 (or whose cluster was restarted) is gone. So a row that waits for
a task (a document to fetch or split, a pod to boot) carries a lease:

- ``queued`` when its task is enqueued: no token, and a deadline by which the
  task should have started (``TASK_START_GRACE_SECONDS``, long enough for a
  queue of thousands of tasks);
- ``acquire`` when the task starts: a token of its own and a short deadline
  (``TASK_LEASE_SECONDS``) that the task renews as it works. One task at a time
  holds it: a second copy of the task (the broker's own retry, a re-enqueue)
  finds it held and leaves;
- ``release`` when the task ends without finishing the row's work: expired at
  once, so that the scaler sends it again.

The scaler tick sends the task again for every waiting row whose lease has
expired (``expired``), and marks it ``queued`` again. A row with no lease at all
(``task_lease_until`` null) was never given one and is left alone.
"""

from __future__ import annotations

import time
import uuid
from datetime import timedelta

from django.conf import settings
from django.db import models
from django.db.models import Q, QuerySet
from django.utils import timezone


class TaskLeased(models.Model):
    task_lease_until = models.DateTimeField(
        null=True, blank=True, help_text="the task working on this must have renewed its lease by then"
    )
    task_lease_token = models.CharField(max_length=32, blank=True, help_text="empty: queued, not started")

    class Meta:
        abstract = True


class LeaseLost(Exception):
    """Another task holds this row's lease now: this one stops and touches nothing."""


def queued() -> dict:
    """Field values for a row whose task was just enqueued."""
    return {
        "task_lease_until": timezone.now() + timedelta(seconds=settings.TASK_START_GRACE_SECONDS),
        "task_lease_token": "",
    }


def acquire(queryset: QuerySet, *, seconds: float | None = None) -> str | None:
    """Take the lease of the one row in ``queryset`` (which also says what state it must
    be in) for ``seconds`` (TASK_LEASE_SECONDS); the token, or None when another task holds it."""
    now = timezone.now()
    token = uuid.uuid4().hex
    seconds = settings.TASK_LEASE_SECONDS if seconds is None else seconds
    taken = free(queryset, now=now).update(task_lease_until=now + timedelta(seconds=seconds), task_lease_token=token)
    return token if taken else None


def acquire_each(queryset: QuerySet, *, seconds: float | None = None) -> str:
    """Take the lease of every row in ``queryset`` that no task holds, in one statement and under
    one token, which is returned: the rows taken are those that carry it now (none, if another
    task holds them all). Each row's lease is then renewed and released on its own, as ever."""
    now = timezone.now()
    token = uuid.uuid4().hex
    seconds = settings.TASK_LEASE_SECONDS if seconds is None else seconds
    free(queryset, now=now).update(task_lease_until=now + timedelta(seconds=seconds), task_lease_token=token)
    return token


def free(queryset: QuerySet, *, now=None) -> QuerySet:
    """Rows whose lease no task holds at ``now``: queued, never leased, released or lapsed."""
    now = now or timezone.now()
    return queryset.filter(Q(task_lease_token="") | Q(task_lease_until__lt=now) | Q(task_lease_until__isnull=True))


def renew(queryset: QuerySet, token: str, *, seconds: float | None = None) -> None:
    """Push the deadline of a lease this task holds; LeaseLost if it holds it no more."""
    seconds = settings.TASK_LEASE_SECONDS if seconds is None else seconds
    renewed = queryset.filter(task_lease_token=token).update(
        task_lease_until=timezone.now() + timedelta(seconds=seconds)
    )
    if not renewed:
        raise LeaseLost("another task took over this row")


def release(queryset: QuerySet, token: str) -> None:
    """End a lease early: a row still waiting is sent again by the next scaler tick."""
    queryset.filter(task_lease_token=token).update(task_lease_until=timezone.now())


def expired(queryset: QuerySet) -> QuerySet:
    """Rows whose task should have started or renewed by now and did not."""
    return queryset.filter(task_lease_until__lt=timezone.now())


class Hold:
    """A lease a long task holds (``acquire``'s token), kept as it works: ``keep`` may be called
    as often as it likes (every page) and renews at most every third of TASK_LEASE_SECONDS;
    LeaseLost once another task took the row."""

    def __init__(self, queryset: QuerySet, token: str) -> None:
        self.queryset, self.token, self.renewed = queryset, token, time.monotonic()

    def keep(self) -> None:
        if time.monotonic() - self.renewed >= settings.TASK_LEASE_SECONDS / 3:
            renew(self.queryset, self.token)
            self.renewed = time.monotonic()

    def confirm(self) -> None:
        """LeaseLost if another task (or a request that queued the row again) took the row: one
        read, for a long task to stop at the next step of its work, not at its next renewal."""
        if not self.queryset.filter(task_lease_token=self.token).exists():
            raise LeaseLost("another task took over this row")
