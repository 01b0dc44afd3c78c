"""Make a fresh installation usable: an admin login, an API token, the schedules."""

from __future__ import annotations

import secrets

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
            credentials.write_text(f"login: admin\npassword: {password}\napi token: {token}\n")
            credentials.chmod(0o600)
            self.stdout.write(self.style.SUCCESS("Created an admin login and an API token:"))
        if credentials.exists():
            self.stdout.write(credentials.read_text().rstrip())
            self.stdout.write(f"(kept in {credentials})")
