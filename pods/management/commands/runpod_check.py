"""Rent one pod of a pool on RunPod, reach its pod server, terminate it, and show every answer:
run it first with a new key, image or pool (docs/runpod.md). The steps: pods/services/runpod_check.py.

    manage.py runpod_check POOL [--spot [--bid DOLLARS]] [--deadline SECONDS]

Exit status 0 when every step did what it should, 1 otherwise (a refusal in words the provider
does not know, a pod that never ran or never answered, Ctrl-C); the pod is terminated either way.
"""

from __future__ import annotations

from decimal import Decimal, InvalidOperation

from django.core.management.base import BaseCommand, CommandError

from pods.models import Pool
from pods.services.runpod_check import runpod_check


def dollars(text: str) -> Decimal:
    try:
        value = Decimal(text)
    except InvalidOperation:
        raise ValueError(text) from None
    if not value.is_finite() or value <= 0:
        raise ValueError(text)
    return value


class Command(BaseCommand):
    help = "Rent the cheapest pod of a RunPod pool, reach its pod server, terminate it; print every answer."

    def add_arguments(self, parser):
        parser.add_argument("pool", help="the key of a pool whose provider is runpod")
        parser.add_argument("--spot", action="store_true", help="an interruptible pod, at a low bid")
        parser.add_argument(
            "--bid", type=dollars, default=None, help="with --spot: $/h per GPU (default: the catalogue's minimum bid)"
        )
        parser.add_argument(
            "--deadline", type=float, default=1200.0, help="seconds for everything before the terminate (default 1200)"
        )

    def handle(self, *args, pool: str, spot: bool, bid: Decimal | None, deadline: float, **options):
        if bid is not None and not spot:
            raise CommandError("--bid goes with --spot")
        if not deadline > 0:
            raise CommandError("--deadline must be a positive number of seconds")
        found = Pool.objects.filter(key=pool).first()
        if found is None:
            raise CommandError(f"no pool {pool!r} (manage.py shell, or the admin, lists them)")

        def say(line: str) -> None:
            self.stdout.write(line)
            self.stdout.flush()

        report = runpod_check(pool=found, spot=spot, bid=bid, deadline_seconds=deadline, say=say)
        if report.failures:
            raise CommandError(f"{len(report.failures)} step(s) failed: " + "; ".join(report.failures))
        say("ok       every step answered as it should")
