"""What a service refuses, and why: domain errors, raised by services and shown by every door.

A service says what went wrong in words for a person (``message``) and of which kind (the
class); it never chooses an HTTP status. The API edge (``fleetadmin.api.STATUS_FOR``) maps
each kind to its status in one table; the job form, the admin's actions and the command line
show the message. ``field``: the input the message is about, when there is one (the form shows
the message beside it).

This module imports nothing, so any layer may raise these.
"""

from __future__ import annotations


class DomainError(Exception):
    """A refusal for a person. Raise one of its kinds below, never this base."""

    def __init__(self, message: str, *, field: str | None = None):
        super().__init__(message)
        self.message = message
        self.field = field


class Invalid(DomainError):
    """Bad input: a value that does not parse or is out of bounds, a file that cannot be read."""


class Forbidden(DomainError):
    """The caller may not do this (a pool not open to them, another user's job)."""


class NotFound(DomainError):
    """What was asked for does not exist (an unknown pool)."""


class Conflict(DomainError):
    """Not in this state: a job that has not ended, nothing configured to serve it."""


class TooLarge(DomainError):
    """Over a size or count limit: a file, a document count, an answer from another machine."""


class UnsupportedType(DomainError):
    """A document of a type that cannot be read (not a PDF or an image)."""


class Unprocessable(DomainError):
    """Well-formed, but it cannot be done as sent: an Idempotency-Key used before for another
    submission, a PDF whose pages only a form's software draws."""


class QuotaExceeded(DomainError):
    """A user's share is used up for now (a daily budget, rebuilds an hour): ask again later."""


class RemoteFailed(DomainError):
    """A machine we do not control did not answer as it must (a document URL's host, a
    webhook's receiver): a timeout, a refused connection, an answer that is not what was asked."""
