"""fleetadmin/apps.py: each process that forks workers (a qcluster, or one of the clusters that
``manage.py workers`` starts, one per work class) imports their modules (the runpod SDK above
all) once, before it forks them, lowers their CPU priority below the front's and keeps their
SQLite connections open; no other process pays for that import at start-up or changes its
priority or its connections."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from fleetadmin.apps import WORKER_MODULES, builds_outputs, forks_workers
from fleetadmin.clusters import CLASSES, OUTPUTS
from tools.processes import REPO, child_env

AFTER_SETUP = (
    "import gc, json, os, sys; os.environ['DJANGO_SETTINGS_MODULE'] = 'fleetadmin.settings'; sys.argv = {argv!r}; "
    "nice = os.nice(0); import django; django.setup(); "
    "from django.db import connection; "
    "print(json.dumps({{'loaded': sorted(m for m in {modules!r} if m in sys.modules), 'nicer': os.nice(0) - nice, "
    "'conn_max_age': connection.settings_dict['CONN_MAX_AGE'], 'frozen': gc.get_freeze_count() > 10000}}))"
)


def _after_setup(argv: list[str], env: dict[str, str]) -> dict:
    code = AFTER_SETUP.format(argv=argv, modules=("runpod", *WORKER_MODULES))
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_every_cluster_imports_the_runpod_sdk_and_the_tasks_and_yields_the_cpu_before_forking(tmp_path):
    clusters = [["manage.py", "workers", "--cluster", work_class] for work_class in CLASSES]
    for argv in (["manage.py", "qcluster"], *clusters, ["manage.py", "workers", "--cluster=dispatch"],
                 ["manage.py", "workers", "--cluster=outputs"]):  # fmt: skip
        shown = _after_setup(argv, child_env(tmp_path, WORKERS_NICE="3", OUTPUTS_NICE="4"))
        assert shown == {
            "loaded": sorted(("runpod", *WORKER_MODULES)),
            # Searchable PDFs yield the CPU to every other class's work too (invariant 20).
            "nicer": 3 + 4 if OUTPUTS in argv or "--cluster=outputs" in argv else 3,
            "conn_max_age": None,
            "frozen": True,
        }, argv


def test_only_the_outputs_cluster_builds_outputs():
    assert builds_outputs(["manage.py", "workers", "--cluster", "outputs"])
    assert builds_outputs(["manage.py", "workers", "--supervisor=7", "--cluster=outputs"])
    for argv in (["manage.py", "workers", "--cluster", "short"], ["manage.py", "workers", "--cluster=dispatch"],
                 ["manage.py", "workers"], ["manage.py", "qcluster"], ["manage.py", "ocr", "outputs"]):  # fmt: skip
        assert not builds_outputs(argv), argv


def test_other_commands_neither_import_the_runpod_sdk_at_start_up_nor_change_priority(tmp_path):
    # Their connections stay as configured: 0 on SQLite; PostgreSQL's are persistent for everyone.
    configured = None if os.environ.get("DATABASE_URL") else 0
    for argv in (["manage.py", "migrate"], ["manage.py", "workers"], ["pytest"]):
        shown = _after_setup(argv, child_env(tmp_path, WORKERS_NICE="3"))
        assert shown == {"loaded": [], "nicer": 0, "conn_max_age": configured, "frozen": False}, argv


def test_the_processes_that_fork_workers_are_the_qcluster_and_the_supervised_clusters():
    assert forks_workers(["manage.py", "qcluster"]) and forks_workers(["django-admin", "qcluster", "--run-once"])
    for work_class in CLASSES:
        assert forks_workers(["/repo/manage.py", "workers", "--cluster", work_class])
    assert not forks_workers(["manage.py", "workers"])  # the supervisor starts the cluster as a new program
    assert not forks_workers(["manage.py", "runpodsim", "qcluster"]) and not forks_workers(["manage.py"])
