"""Shared set-up for benchmarks: a throw-away database (SQLite, or DATABASE_URL) and Django, and
the session every benchmark runs in (``bench_session``).

The processes a benchmark starts (front, workers, simulator) come from tools/processes.py, as
the tests' do.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import json
import os
import shutil
import signal
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

from tools.processes import REPO, Children, child_env, point_at_simulator, start_front, start_simulator, start_workers


@contextlib.contextmanager
def bench_session(
    name: str,
    *,
    database_url: str = "",
    simulator: dict | None = None,
    api_key: str = "",
    env: dict[str, str] | None = None,
    release_pods: bool = False,
) -> Iterator[tuple[Children, str]]:
    """The benchmark's processes and database: yields (its children, the simulator's URL or "").
    SIGTERM ends it through the finally (children stopped); ``simulator`` (a runpodsim config) is
    started first and the control plane pointed at it with ``api_key``; ``env`` is set beside a
    queue cluster name of its own; ``release_pods``: its local pods are released at the end (they
    run in sessions of their own: stopping the workers leaves them up). The logs' folder is
    printed last."""
    raise_on_sigterm()
    children = Children(Path(tempfile.mkdtemp(prefix=f"fleetadmin-bench-{name}-logs-")))
    try:
        sim_url = ""
        if simulator is not None:
            sim, sim_url = start_simulator(simulator, children.log_dir, own_session=False)
            children.add(sim)
            point_at_simulator(sim_url, api_key)
        os.environ.update(Q_CLUSTER_NAME=f"bench-{uuid.uuid4().hex[:6]}", **(env or {}))
        django_for_bench(name, database_url=database_url)
        yield children, sim_url
    finally:
        children.stop_all()
        if release_pods:
            release_local_pods()
        print(f"logs: {children.log_dir}", file=sys.stderr)


def parse_sized(parser: argparse.ArgumentParser, small: dict) -> argparse.Namespace:
    """The benchmark's arguments, with ``--small`` (CI's size: ``small``'s values) and ``--database-url``."""
    parser.add_argument("--small", action="store_true", help="CI's size: " + json.dumps(small))
    parser.add_argument("--database-url", default=os.environ.get("DATABASE_URL", ""))
    args = parser.parse_args()
    if args.small:
        for key, value in small.items():
            setattr(args, key, value)
    return args


def front_and_workers(children: Children):
    """A front and workers on the benchmark's database, as children: (front, workers, an httpx
    client of the front). This process's connection is closed first (SQLite: one writer)."""
    import httpx
    from django.db import connection

    env = child_env()
    connection.close()
    front, front_url = start_front(env, children.log_dir, own_session=False)
    children.add(front)
    workers = children.add(start_workers(env, children.log_dir, own_session=False))
    return front, workers, httpx.Client(base_url=front_url, timeout=60)


def raise_on_sigterm() -> None:
    """SIGTERM ends the benchmark through its finally blocks (children are stopped)."""

    def handler(signum, frame):
        raise SystemExit(f"stopped by signal {signum}")

    signal.signal(signal.SIGTERM, handler)


def django_for_bench(name: str, *, database_url: str = "") -> Path:
    """Configure Django on a fresh database (SQLite in a temporary directory, or ``database_url``
    emptied); returns that directory. The directory (the database, the documents stored: 786 MB a
    run of bench/ingest.py) is removed when the benchmark exits, unless BENCH_KEEP=1: runs once
    filled this machine's disk."""
    sys.path.insert(0, str(REPO))
    if database_url:
        os.environ["DATABASE_URL"] = database_url
    var_dir = Path(tempfile.mkdtemp(prefix=f"fleetadmin-bench-{name}-"))
    if os.environ.get("BENCH_KEEP") != "1":
        atexit.register(shutil.rmtree, var_dir, ignore_errors=True)
    os.environ["FLEETADMIN_VAR_DIR"] = str(var_dir)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "fleetadmin.settings")
    if os.environ.get("DATABASE_URL"):
        os.environ.setdefault("SECRET_KEY", "bench-only")
    import django

    django.setup()
    from django.core.management import call_command

    if os.environ.get("DATABASE_URL"):
        _empty_database()
    call_command("migrate", interactive=False, verbosity=0)
    return var_dir


def release_local_pods() -> int:
    """After the benchmark's front and workers are stopped: release its local pods and terminate
    them here (no pass will come), as ``manage.py up`` does when it stops. They run in sessions of
    their own and outlived the benchmark until their autostop (bench/hostile.py and
    bench/busy_workers.py left theirs up). Nothing if Django was never set up."""
    from django.apps import apps

    if not apps.ready:
        return 0
    from pods.services.lifecycle import local_pods_release

    return local_pods_release(reason="benchmark over")


def _empty_database() -> None:
    """Drop the PostgreSQL database's public schema and make it anew, so that migrate starts from
    nothing. Not flush: flush empties the rows migrations wrote (the local pool), which migrate
    does not write again on a database it finds migrated, and keeps the tables and columns of
    another branch's migrations. (2.4 s with the migrations here; flush and migrate took 0.8 s.)"""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("DROP SCHEMA public CASCADE")
        cursor.execute("CREATE SCHEMA public")
