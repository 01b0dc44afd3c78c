"""Django's PostgreSQL backend for the front, whose connection pool checks each connection
before handing it out without a round trip to the server.

A connection that PostgreSQL ended while it sat in the pool (a restart, a failover, a killed
backend) has something to read: the server's FATAL message, or the end of the stream. An idle
connection in autocommit is sent nothing else, so a readable socket means the connection is gone,
and the pool opens another instead of failing the request that would have used it. The check is
one ``poll`` system call, where psycopg_pool's own check (``CONN_HEALTH_CHECKS``) is a query.
"""

from __future__ import annotations

import select

import psycopg
from django.db.backends.postgresql import base
from psycopg_pool import ConnectionPool


def check_idle_connection(conn: psycopg.Connection) -> None:
    """Raise if the server has ended this idle connection; psycopg_pool then discards it."""
    if conn.closed or conn.broken:
        raise psycopg.OperationalError("the connection is closed")
    poller = select.poll()
    poller.register(conn.fileno(), select.POLLIN | select.POLLPRI)
    if poller.poll(0):
        conn.close()  # the pool takes back an open connection that failed its check, and hands it out again
        raise psycopg.OperationalError("the server wrote to an idle connection: it has ended it")


class DatabaseWrapper(base.DatabaseWrapper):
    @property
    def pool(self):
        options = self.settings_dict["OPTIONS"].get("pool")
        if not options or self.alias == base.NO_DB_ALIAS:
            return None
        if self.alias not in self._connection_pools:
            kwargs = self.get_connection_params()
            kwargs["autocommit"] = True  # as Django's own pool: Django sets it per connection later
            pool = ConnectionPool(
                kwargs=kwargs,
                open=False,
                configure=self._configure_connection,
                check=check_idle_connection,
                **(options if isinstance(options, dict) else {}),
            )
            self._connection_pools.setdefault(self.alias, pool)  # as Django: the first thread's wins
        return self._connection_pools[self.alias]
