"""Django's SQLite backend for the front, whose connections wait for the next request instead of
closing.

Django's ASGI handler runs each request on a thread of its own, and a connection opened there is
closed when the request ends (CONN_MAX_AGE cannot keep it: the next request has another thread).
A submission opened two: django-q2's ORM broker closes the request's connection before it enqueues
the split and opens another. Each costs ~1.7 ms of CPU (sqlite3.connect, the PRAGMAs, Django's SQL
functions) and its close more (py-spy on bench/uploads.py: ~12% of the view's samples). Here a
connection closed outside a transaction goes back to a list of idle ones, and the next request's
thread takes it. Django opens SQLite connections with check_same_thread=False: one may pass from
thread to thread, used by one at a time, as here.
"""

from __future__ import annotations

import threading

from django.db.backends.sqlite3 import base

_idle: dict[str, list] = {}  # database file → connections waiting for a request
_lock = threading.Lock()


class DatabaseWrapper(base.DatabaseWrapper):
    def get_connection_params(self) -> dict:
        params = super().get_connection_params()
        self._pool_size = int(params.pop("pool", {}).get("max_size", 8))
        return params

    def get_new_connection(self, conn_params: dict):
        with _lock:
            idle = _idle.get(str(conn_params["database"]))
            connection = idle.pop() if idle else None
        return connection if connection is not None else super().get_new_connection(conn_params)

    def _close(self) -> None:
        connection = self.connection
        if connection is None or self.in_atomic_block or connection.in_transaction:
            return super()._close()  # closing it rolls back what it was doing
        with _lock:
            idle = _idle.setdefault(str(self.settings_dict["NAME"]), [])
            if len(idle) < self._pool_size:
                idle.append(connection)
                return None
        return super()._close()
