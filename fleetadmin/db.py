"""Surviving a database that dropped our connections (a restart, a failover, a killed backend),
and the front's connection pool.

Persistent connections (CONN_MAX_AGE=None) outlive such a drop in long-lived
workers: the next query fails once with OperationalError. The work here is
idempotent, so it is run again on a fresh connection.
"""

from __future__ import annotations

import functools
import logging
import time

from django.db import InterfaceError, OperationalError, connections

log = logging.getLogger(__name__)

DB_ERRORS = (OperationalError, InterfaceError)


def retry_on_db_error(func=None, *, attempts: int = 4, delay: float = 1.0):
    """Run an idempotent task again, on fresh connections, when the database dropped them."""

    def decorate(fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            for attempt in range(1, attempts + 1):
                try:
                    return fn(*args, **kwargs)
                except DB_ERRORS as exc:
                    if attempt == attempts:
                        raise
                    log.warning("%s: database error (%s); again on a fresh connection", fn.__name__, exc)
                    for connection in connections.all(initialized_only=True):
                        connection.close()
                    time.sleep(delay * attempt)
            return None

        return wrapper

    return decorate(func) if func is not None else decorate


def use_connection_pool(databases: dict, pool: dict) -> None:
    """Give the default PostgreSQL database Django's psycopg pool (``OPTIONS["pool"]``), the
    embedded SQLite one idle connections kept for the next request (fleetadmin/pooled_sqlite),
    before any connection is made. A connection closed at the end of a request goes back to the pool."""
    default = databases["default"]
    if default["ENGINE"] == "django.db.backends.sqlite3":
        default["OPTIONS"] = {**default.get("OPTIONS", {}), "pool": {"max_size": pool["max_size"]}}
        default["ENGINE"] = "fleetadmin.pooled_sqlite"
        return
    if default["ENGINE"] != "django.db.backends.postgresql":
        return
    default["OPTIONS"] = {**default.get("OPTIONS", {}), "pool": dict(pool)}
    default["CONN_MAX_AGE"] = 0  # the pool keeps the connections (Django refuses both)
    # Each checkout is checked without a round trip (a query was the slowest part of a request on a
    # busy machine): a connection the server ended while it sat in the pool is replaced, not used.
    default["ENGINE"] = "fleetadmin.pooled_postgresql"
    default["CONN_HEALTH_CHECKS"] = False  # Django's check would be that query
