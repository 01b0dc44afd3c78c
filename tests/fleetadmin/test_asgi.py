"""The front's entry point (fleetadmin/asgi.py): on PostgreSQL its connections come from a pool, on
SQLite its idle connections wait for the next request; processes that do not start from it
(workers, commands, this test suite) keep their settings."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from django.db import connection

from fleetadmin.db import use_connection_pool
from tools.processes import REPO, child_env

SHOW_DATABASE = (
    "from django.conf import settings; from django.db import connection; "
    "print(json.dumps({'pool': settings.DATABASES['default'].get('OPTIONS', {}).get('pool'), "
    "'conn_max_age': settings.DATABASES['default']['CONN_MAX_AGE'], "
    "'health_checks': settings.DATABASES['default']['CONN_HEALTH_CHECKS']}))"
)


def _python(code: str, env: dict[str, str]) -> dict:
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture
def postgres_env(tmp_path, settings) -> dict[str, str]:
    # Nothing listens there: settings are read, no connection is made.
    return child_env(tmp_path, DATABASE_URL="postgres://nobody@127.0.0.1:9/none", SECRET_KEY="x")


def test_the_front_pools_postgresql_connections(postgres_env):
    shown = _python(f"import json, fleetadmin.asgi; {SHOW_DATABASE}", postgres_env)

    assert shown["pool"]["max_size"] >= shown["pool"]["min_size"] >= 1
    assert shown["conn_max_age"] == 0  # Django refuses a pool with persistent connections
    assert shown["health_checks"] is False  # no round trip before every request's query


def test_other_processes_keep_persistent_connections(postgres_env):
    # A qcluster forks its workers: a pool's connections and threads would not survive it.
    code = f"import json, django, os; os.environ['DJANGO_SETTINGS_MODULE'] = 'fleetadmin.settings'; django.setup(); {SHOW_DATABASE}"
    kept = {"pool": None, "conn_max_age": None, "health_checks": True}
    assert _python(code, postgres_env) == kept
    # ...and one that imports the front's module after it started keeps them too.
    later = code.replace("django.setup();", "django.setup(); import fleetadmin.asgi;")
    assert _python(later, postgres_env) == kept


def _sqlite_env(tmp_path) -> dict[str, str]:
    env = child_env(tmp_path)
    env.pop("DATABASE_URL", None)
    env["SQLITE_PATH"] = str(tmp_path / "db.sqlite3")
    return env


def test_the_embedded_sqlite_front_keeps_idle_connections(tmp_path, settings):
    shown = _python(f"import json, fleetadmin.asgi; {SHOW_DATABASE}", _sqlite_env(tmp_path))
    assert shown["pool"]["max_size"] >= 1
    # Other processes open their own, as Django does.
    code = f"import json, django, os; os.environ['DJANGO_SETTINGS_MODULE'] = 'fleetadmin.settings'; django.setup(); {SHOW_DATABASE}"
    assert _python(code, _sqlite_env(tmp_path))["pool"] is None


def test_use_connection_pool_gives_sqlite_its_idle_connections():
    databases = {"default": {"ENGINE": "django.db.backends.sqlite3", "OPTIONS": {"timeout": 20}, "CONN_MAX_AGE": 0}}
    use_connection_pool(databases, {"min_size": 1, "max_size": 2})
    assert databases["default"]["ENGINE"] == "fleetadmin.pooled_sqlite"
    assert databases["default"]["OPTIONS"] == {"timeout": 20, "pool": {"max_size": 2}}


def test_on_sqlite_the_front_reuses_connections_across_request_threads(tmp_path):
    # What Django's ASGI handler does: each request on a new thread, its connection closed at the end;
    # and what django-q2's ORM broker does after a submission commits: close, then open again.
    code = """
import json, threading, fleetadmin.asgi
from django.db import connection, transaction
from django.db.backends.signals import connection_created

opened = []
connection_created.connect(lambda sender, connection, **kwargs: opened.append(id(connection.connection)), weak=False)

def request():
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("CREATE TABLE IF NOT EXISTS t (x)")
            cursor.execute("INSERT INTO t VALUES (1)")
    connection.close()
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM t")
        rows = cursor.fetchone()[0]
    connection.close()
    return rows

rows = []
for _ in range(20):
    thread = threading.Thread(target=lambda: rows.append(request()))
    thread.start()
    thread.join()
print(json.dumps({"rows": rows, "connections": len(set(opened)), "opened": len(opened)}))
"""
    shown = _python(code, _sqlite_env(tmp_path))
    assert shown["rows"] == list(range(1, 21))  # every request's write committed and seen by the next
    assert shown["opened"] == 40
    assert shown["connections"] == 1  # one sqlite3 connection, passed from thread to thread


@pytest.mark.skipif(connection.vendor != "postgresql", reason="the pool is for PostgreSQL")
def test_on_postgresql_the_front_reuses_pooled_connections_across_request_threads(tmp_path, db):
    # What Django's ASGI handler does: each request on a new thread, its connection closed at the end.
    code = """
import json, threading, fleetadmin.asgi
from django.db import connection

def request():
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    connection.close()

for _ in range(20):
    thread = threading.Thread(target=request)
    thread.start()
    thread.join()
stats = connection.pool.get_stats()
print(json.dumps({"requests": stats["requests_num"], "connections": stats.get("connections_num", 0)}))
"""
    shown = _python(code, child_env(tmp_path))
    assert shown["requests"] == 20
    assert shown["connections"] <= 4  # the pool's few, not one per request


@pytest.mark.skipif(connection.vendor != "postgresql", reason="the pool is for PostgreSQL")
def test_connections_the_server_ended_while_pooled_are_replaced_not_used(tmp_path, db):
    # What a restart does to the front: the server ends the connections sitting in its pool.
    code = """
import json, os, threading, time, fleetadmin.asgi, psycopg
from django.db import connection

pids, barrier = [], threading.Barrier(4)

def hold():  # four requests at once: four connections in the pool afterwards
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        pids.append(cursor.fetchone()[0])
        barrier.wait()
    connection.close()

threads = [threading.Thread(target=hold) for _ in range(4)]
[t.start() for t in threads]
[t.join() for t in threads]
with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as admin:
    admin.execute("SELECT pg_terminate_backend(pid) FROM unnest(%s::int[]) AS pid", [pids])
    while admin.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(%s)", [pids]).fetchone()[0]:
        time.sleep(0.05)

results = []
def request():
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        results.append("ok")
    except Exception as exc:
        results.append(type(exc).__name__)
    finally:
        connection.close()

for _ in range(8):
    thread = threading.Thread(target=request)
    thread.start()
    thread.join()
print(json.dumps({"ended": len(set(pids)), "results": results}))
"""
    shown = _python(code, child_env(tmp_path))
    assert shown["ended"] == 4
    assert shown["results"] == ["ok"] * 8


def test_the_front_imports_its_urlconf_at_start_not_on_its_first_request(tmp_path):
    # Resolved lazily, the URLconf (every view and the API's models) was imported on the event
    # loop by the first request: for up to ~2 s after a start nothing was answered, /healthz neither.
    shown = _python(
        "import json, sys, fleetadmin.asgi; from django.urls import get_resolver; "
        "print(json.dumps({'urls': 'fleetadmin.urls' in sys.modules, 'api': 'ocrjobs.api' in sys.modules, "
        "'populated': get_resolver()._populated}))",
        _sqlite_env(tmp_path),
    )
    assert shown == {"urls": True, "api": True, "populated": True}


def test_the_front_imports_what_requests_use_and_freezes_it_at_start_up(tmp_path):
    # The first submissions each waited on these imports, and bench/ingest.py counted them per page;
    # what start-up made is out of the collector's sight (gc.freeze).
    code = "import gc, json, sys, fleetadmin.asgi; print(json.dumps([m in sys.modules for m in ('fleetadmin.urls', 'ocrjobs.api', 'ocrjobs.tasks')] + [gc.get_freeze_count() > 10000]))"
    assert _python(code, _sqlite_env(tmp_path)) == [True, True, True, True]
