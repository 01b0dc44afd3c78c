"""Shared set-up for benchmarks: a throw-away database (SQLite, or DATABASE_URL) and Django.

The processes a benchmark starts (front, workers, simulator) come from tools/processes.py, as
the tests' do.
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path

from tools.processes import REPO


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
