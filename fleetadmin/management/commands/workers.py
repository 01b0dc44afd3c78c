"""Run the workers: a django-q2 cluster, started afresh whenever it breaks.

Use this instead of ``manage.py qcluster``: a qcluster whose worker is killed by a signal while
it waits for a task never runs a task again (see ``fleetadmin.workers``). SIGTERM or Ctrl-C stops
every process of the cluster.
"""

from __future__ import annotations

import argparse
import signal
import sys

from django.conf import settings
from django.core.management.base import BaseCommand

from fleetadmin.workers import Supervisor, run_cluster


class Command(BaseCommand):
    help = "Run the workers (a django-q2 cluster) and start them afresh whenever they break."

    def add_arguments(self, parser):
        parser.add_argument(
            "--grace", type=float, default=10.0, help="seconds the workers get to finish their tasks on stop"
        )
        parser.add_argument(
            "--stuck-seconds",
            type=float,
            default=60.0,
            help="a cluster process dead and unreaped this long means the cluster is stuck: start it afresh",
        )
        # What the supervisor starts: one cluster in this process.
        parser.add_argument("--cluster", action="store_true", help=argparse.SUPPRESS)

    def handle(self, *args, grace: float, stuck_seconds: float, cluster: bool, **options):
        if cluster:
            sys.exit(run_cluster())
        supervisor = Supervisor(
            [sys.executable, str(settings.BASE_DIR / "manage.py"), "workers", "--cluster"],
            cwd=settings.BASE_DIR,
            grace_seconds=grace,
            stuck_seconds=stuck_seconds,
        )
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda signum, frame: supervisor.stop())
        supervisor.run()
