"""Shared set-up for benchmarks: a throw-away database (SQLite, or DATABASE_URL) and Django."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def django_for_bench(name: str) -> Path:
    """Configure Django on a fresh database in a temporary directory; returns that directory."""
    sys.path.insert(0, str(REPO))
    var_dir = Path(tempfile.mkdtemp(prefix=f"fleetadmin-bench-{name}-"))
    os.environ["FLEETADMIN_VAR_DIR"] = str(var_dir)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "fleetadmin.settings")
    if os.environ.get("DATABASE_URL"):
        os.environ.setdefault("SECRET_KEY", "bench-only")
    import django

    django.setup()
    from django.core.management import call_command

    if os.environ.get("DATABASE_URL"):
        call_command("flush", interactive=False, verbosity=0)
    call_command("migrate", interactive=False, verbosity=0)
    return var_dir


def start_simulator(config: dict) -> tuple[subprocess.Popen, str]:
    """`manage.py runpodsim` with this config, as a subprocess; returns it and its URL."""
    path = tempfile.NamedTemporaryFile("w", suffix=".json", delete=False)
    json.dump(config, path)
    path.close()
    proc = subprocess.Popen([sys.executable, "manage.py", "runpodsim", "--port", "0", "--config", path.name],
                            cwd=REPO, stdout=subprocess.PIPE, text=True)  # fmt: skip
    for line in proc.stdout:
        if line.startswith("RUNPODSIM "):
            return proc, line.split()[1].strip()
    raise SystemExit("the simulator did not start")
