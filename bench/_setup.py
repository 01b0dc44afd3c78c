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


def _empty_database() -> None:
    """Empty the PostgreSQL database for this run. When it holds exactly this tree's migrations,
    flush it (0.8 s here); otherwise (an earlier run of another branch, with migrations this tree
    does not have) drop its public schema and make it anew, so that migrate starts from nothing
    (2.4 s with the migrations): flush would keep that branch's tables and columns."""
    from django.core.management import call_command
    from django.db import connection
    from django.db.migrations.loader import MigrationLoader

    loader = MigrationLoader(connection)
    if set(loader.applied_migrations) == set(loader.graph.nodes):
        call_command("flush", interactive=False, verbosity=0)
        return
    with connection.cursor() as cursor:
        cursor.execute("DROP SCHEMA public CASCADE")
        cursor.execute("CREATE SCHEMA public")
        cursor.execute("GRANT ALL ON SCHEMA public TO public")
