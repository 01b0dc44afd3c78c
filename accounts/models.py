from __future__ import annotations

import hashlib
import secrets

from django.conf import settings
from django.db import models

SCOPES = ("read", "submit", "webhooks", "admin")


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class ApiToken(models.Model):
    """A bearer token for the JSON API. Only its hash is stored."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=100)
    token_hash = models.CharField(max_length=64, unique=True)
    scopes = models.CharField(max_length=100, help_text="comma-separated: read, submit, webhooks, admin")
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.name} ({self.user})"

    @classmethod
    def issue(cls, *, user, name: str, scopes: list[str]) -> tuple[ApiToken, str]:
        unknown = set(scopes) - set(SCOPES)
        if unknown:
            raise ValueError(f"unknown scopes: {', '.join(sorted(unknown))}")
        token = "fa_" + secrets.token_urlsafe(32)
        row = cls.objects.create(user=user, name=name, token_hash=hash_token(token), scopes=",".join(scopes))
        return row, token

    def scope_list(self) -> list[str]:
        return [s for s in self.scopes.split(",") if s]

    def allows(self, scope: str) -> bool:
        # admin implies every scope, submit implies read; webhooks (the signing secret) only itself.
        granted = set(self.scope_list())
        if "admin" in granted:
            return True
        if scope == "read" and "submit" in granted:
            return True
        return scope in granted


class Budget(models.Model):
    """What a user's jobs may cost in a day (any 24 hours), in place of USER_DOLLARS_PER_DAY."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="budget")
    dollars_per_day = models.DecimalField(
        max_digits=10, decimal_places=2, null=True, blank=True, help_text="empty: no limit for this user"
    )

    def __str__(self) -> str:
        return f"{self.user}: {self.dollars_per_day if self.dollars_per_day is not None else 'no limit'} $/day"
