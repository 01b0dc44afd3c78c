"""Run the workers: a django-q2 cluster per work class, each started afresh whenever it breaks,
and the clock that asks for passes.

Use this instead of ``manage.py qcluster``: a qcluster whose worker is killed by a signal while
it waits for a task never runs a task again (see ``fleetadmin.workers``), and work that runs long
gets capacity of its own (``fleetadmin.clusters``). SIGTERM or Ctrl-C stops every process of
every cluster, within ``--grace`` also when the supervisor is killed with -9.
"""

from __future__ import annotations

import logging
import os
import signal
import sys

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from fleetadmin.clusters import CLASSES, PassClock, cluster_env, cluster_name, work_classes
from fleetadmin.workers import Supervised, Supervisor, run_cluster

log = logging.getLogger("fleetadmin.workers")


class Command(BaseCommand):
    help = "Run the workers (a django-q2 cluster per work class) and start each afresh whenever it breaks."

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
        # What the supervisor starts: one class's cluster in this process (Q_CLUSTER_NAME, set by the
        # supervisor, picks its settings; the class on the command line says which one it is in `ps`).
        parser.add_argument(
            "--cluster", choices=CLASSES, help="run one work class's cluster (what the supervisor starts)"
        )
        parser.add_argument(
            "--supervisor", type=int, help="with --cluster: the supervisor's pid; the cluster ends when it is gone"
        )

    def handle(self, *args, grace: float, stuck_seconds: float, cluster: str | None, supervisor: int | None, **options):
        if cluster:
            from django_q.conf import Conf

            if Conf.CLUSTER_NAME != cluster_name(cluster):
                raise CommandError(f"the {cluster} cluster runs with Q_CLUSTER_NAME={cluster_name(cluster)}: "
                                   "let `manage.py workers` start it")  # fmt: skip
            sys.exit(run_cluster(supervisor=supervisor, grace_seconds=grace))
        classes = work_classes()
        for work_class in classes:
            log.info("%s (cluster %s)", work_class.describe(), cluster_name(work_class.name))
        manage = [sys.executable, str(settings.BASE_DIR / "manage.py"), "workers", f"--grace={grace:g}",
                  f"--supervisor={os.getpid()}", "--cluster"]  # fmt: skip
        supervisor = Supervisor(
            [Supervised(c.name, [*manage, c.name], cluster_env(c, classes)) for c in classes],
            cwd=settings.BASE_DIR,
            grace_seconds=grace,
            stuck_seconds=stuck_seconds,
            clock=PassClock(),
            clock_seconds=settings.PASS_INTERVAL_SECONDS,
        )
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda signum, frame: supervisor.stop())
        supervisor.run()
