"""The audit record: who released or terminated a pod, or cancelled, retried or rebuilt a job.

Services call ``audit_record`` in the transaction that does the action, so an entry exists
exactly when the action happened, whichever door (API, page, admin, CLI) asked for it. A door
says who asks with an ``Actor``; a service called without one (the system's own shed, drain or
clean-up) records nothing.
"""

from __future__ import annotations

import getpass
from dataclasses import dataclass

from django.contrib.auth import get_user_model
from django.core.management.base import CommandError

from pods.models import AuditEntry, Pod


@dataclass(frozen=True)
class Actor:
    user: object  # a User, or None: a command run without --user (the OS user is named)
    door: str  # AuditEntry.Door

    @property
    def name(self) -> str:
        return self.user.get_username() if self.user is not None else f"{getpass.getuser()} (shell)"


def add_actor_argument(parser) -> None:
    parser.add_argument("--user", help="who asks (an existing username); the OS user otherwise")


def cli_actor(username: str | None) -> Actor:
    """The actor of a management command: ``--user`` when given (CommandError if there is no such
    user), else the OS user."""
    user = None
    if username:
        user = get_user_model().objects.filter(username=username).first()
        if user is None:
            raise CommandError(f"no user {username!r}")
    return Actor(user=user, door=AuditEntry.Door.CLI)


def audit_record(*, actor: Actor | None, action: str, pod: Pod | None = None, job=None, detail: str = "") -> None:
    if actor is None:
        return
    AuditEntry.objects.create(
        actor=actor.user if getattr(actor.user, "pk", None) else None,
        actor_name=actor.name[:150],
        action=action,
        door=actor.door,
        pod=pod,
        job=job,
        detail=detail[:500],
    )
