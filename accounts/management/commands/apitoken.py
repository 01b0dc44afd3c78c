from __future__ import annotations

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from accounts.models import SCOPES, ApiToken


class Command(BaseCommand):
    help = "Issue an API token for a user and print it (only its hash is stored)."

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("--scopes", default="read,submit", help=f"comma-separated from {', '.join(SCOPES)}")
        parser.add_argument("--name", default="command line")

    def handle(self, *args, username, scopes, name, **options):
        try:
            user = get_user_model().objects.get(username=username)
        except get_user_model().DoesNotExist:
            raise CommandError(f"no user {username!r}") from None
        try:
            _, token = ApiToken.issue(user=user, name=name, scopes=[s.strip() for s in scopes.split(",") if s.strip()])
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(token)
