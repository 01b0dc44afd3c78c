"""Show the prefix this deployment names its pods with, or give the database a fresh one."""

from __future__ import annotations

from django.conf import settings
from django.core.management.base import BaseCommand

from fleetadmin.deployment import renew_prefix, stored_prefix


class Command(BaseCommand):
    help = "Show this deployment's pod prefix (fleetadmin/deployment.py); --renew gives the database a fresh one."

    def add_arguments(self, parser):
        parser.add_argument(
            "--renew",
            action="store_true",
            help="a fresh prefix for the database (after an upgrade that kept the shared 'fa'); restart every host",
        )

    def handle(self, *args, renew: bool, **options):
        stored = renew_prefix() if renew else stored_prefix()
        if settings.DEPLOYMENT_PREFIX:
            self.stdout.write(f"{settings.DEPLOYMENT_PREFIX} (from FLEETADMIN_DEPLOYMENT; the database keeps {stored})")
        else:
            self.stdout.write(stored)
        if renew:
            self.stdout.write("restart every host to name new pods with it; the pods the database has stay its own")
