from __future__ import annotations

import gc
import importlib
import os
import sys

from django.apps import AppConfig
from django.conf import settings
from django.core import checks

from fleetadmin.checks import check_middleware
from fleetadmin.clusters import OUTPUTS
from fleetadmin.deployment import check_pod_prefix

# What a qcluster's workers import for their tasks. The qcluster imports it once, before it forks
# them: the runpod SDK alone costs a worker 1.5-2 s of CPU, and 32 workers paying it on their first
# boot at once starved the machine (the front included).
WORKER_MODULES = ("pods.providers.runpod", "pods.tasks", "ocrjobs.tasks")


def supervised_cluster(argv: list[str]) -> str | None:
    """The work class of a cluster that ``manage.py workers`` starts (``workers --cluster <class>``),
    or None for any other process (the supervisor included)."""
    args = argv[2:] if argv[1:2] == ["workers"] else []
    for index, arg in enumerate(args):
        if arg == "--cluster":
            return next(iter(args[index + 1 : index + 2]), "")
        if arg.startswith("--cluster="):
            return arg.removeprefix("--cluster=")
    return None


def forks_workers(argv: list[str]) -> bool:
    """Whether this process runs a django-q2 cluster, which forks the workers: ``manage.py qcluster``,
    or a cluster that ``manage.py workers`` starts (one per work class), not its supervisor."""
    return argv[1:2] == ["qcluster"] or supervised_cluster(argv) is not None


def builds_outputs(argv: list[str]) -> bool:
    """Whether this process is the outputs' cluster (``workers --cluster outputs``)."""
    return supervised_cluster(argv) == OUTPUTS


class FleetadminConfig(AppConfig):
    """Project-wide pieces that need a table: the loop heartbeats, the worker hosts, the deployment."""

    name = "fleetadmin"
    verbose_name = "fleetadmin"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        checks.register(check_pod_prefix)
        checks.register(check_middleware, checks.Tags.security, deploy=True)
        # Only there: every other command and the test suite import the SDK when they use it.
        if forks_workers(sys.argv):
            prepare_workers(outputs=builds_outputs(sys.argv))


def prepare_workers(*, outputs: bool = False) -> None:
    """In the process that forks the workers, before it does: what they all inherit."""
    # Invariant 1 on a shared machine: the front (and the database) get the CPU first when
    # workers want more than there is; the workers' work waits a little, requests do not.
    # Invariant 20: searchable PDFs wait for everything else (OUTPUTS_NICE lower still).
    os.nice(settings.WORKERS_NICE + (settings.OUTPUTS_NICE if outputs else 0))
    keep_connections()
    for module in WORKER_MODULES:
        importlib.import_module(module)
    # What start-up made lives as long as the process: out of the collector's sight, so that a
    # full collection (one every few split tasks) does not walk its ~140,000 objects (90 ms each
    # on a 2-core machine), and the forked workers share those pages instead of copying them.
    gc.freeze()


def keep_connections() -> None:
    """Workers keep their SQLite connections open, as they keep PostgreSQL's (settings.py).

    django-q2 closes a connection that is past its CONN_MAX_AGE before every broker poll (5 a
    second per cluster) and every task: at SQLite's default of 0 each poll opened a new one (its
    PRAGMAs, Django's SQL functions registered again), 0.25 CPU-s per idle cluster every 20 s and
    most of the pushers' CPU. django-q2 closes every connection before it forks, so none is shared.
    """
    from django.db import connections

    for alias in connections:
        connection = connections[alias]
        if connection.vendor == "sqlite" and connection.settings_dict.get("CONN_MAX_AGE") == 0:
            connection.close()  # a connection opened before this keeps its old deadline otherwise
            connection.settings_dict["CONN_MAX_AGE"] = None
