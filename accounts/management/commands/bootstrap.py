"""Make a fresh installation usable: an admin login, an API token, the schedules."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand

from accounts.models import ApiToken
from fleetadmin.schedules import setup_schedules


class Command(BaseCommand):
    help = "Create an admin login and token if there is none, and upsert the schedules."

    def handle(self, *args, **options):
        setup_schedules()
        credentials = settings.VAR_DIR / "admin-credentials.txt"
        User = get_user_model()
        if not User.objects.filter(is_superuser=True).exists():
            password = secrets.token_urlsafe(12)
            user = User.objects.create_superuser("admin", "", password)
            _, token = ApiToken.issue(user=user, name="created by make run", scopes=["admin"])
            write_private(credentials, f"login: admin\npassword: {password}\napi token: {token}\n")
            # Printed this once only: later starts (and a deploy's logs) name the file, not the secrets.
            self.stdout.write(self.style.SUCCESS("Created an admin login and an API token:"))
            self.stdout.write(credentials.read_text().rstrip())
        if credentials.exists():
            self.stdout.write(f"The admin login and API token are in {credentials}")


def write_private(path: Path, text: str) -> None:
    """Write a file only its owner can read, from its first byte (no window at the umask's mode)."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
