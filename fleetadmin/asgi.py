"""The front: Django over daphne (fleetadmin/front.py), static files served by the ASGI handler
(plain daphne serves no /static/) with a policy of their own (fleetadmin/staticpolicy.py),
``GET /healthz`` answered before Django (fleetadmin/healthz.py), a body the server handed over
read as it is, and PostgreSQL connections from a pool."""

import contextvars
import gc
import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "fleetadmin.settings")

import django
from channels.auth import AuthMiddlewareStack
from channels.routing import ProtocolTypeRouter, URLRouter
from channels.security.websocket import AllowedHostsOriginValidator
from django.apps import apps
from django.conf import settings
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler
from django.core.exceptions import RequestAborted
from django.core.handlers.asgi import ASGIHandler
from django.urls import get_resolver

from fleetadmin import formdata
from fleetadmin.db import use_connection_pool
from fleetadmin.healthz import HealthzFirst
from fleetadmin.loopwatch import watch_loop
from fleetadmin.staticpolicy import StaticPolicy

# The request body the server received, handed over in the scope (fleetadmin/front.py).
BODY_EXTENSION = "fleetadmin.body"
_handed_body: contextvars.ContextVar = contextvars.ContextVar("handed_body", default=None)


class FrontASGIHandler(ASGIHandler):
    """Django's ASGI handler, taking a body the server handed over in the scope as its body file
    (no second spool of its messages). Without one (another server, a test) it reads the body's
    messages as Django does."""

    async def handle(self, scope, receive, send):
        body = scope.get("extensions", {}).get(BODY_EXTENSION)
        _handed_body.set(body)
        # A form the front read as it arrived: what ocrjobs.uploads' handler gives Django as POST and FILES.
        formdata.received.set(body if isinstance(body, formdata.FormData) else None)
        return await super().handle(scope, receive, send)

    async def read_body(self, receive):
        body = _handed_body.get()
        if body is None:
            return await super().read_body(receive)
        while True:
            message = await receive()  # daphne's one empty message
            if message["type"] == "http.disconnect":
                body.close()
                raise RequestAborted()
            if not message.get("more_body", False):
                break
        body.seek(0)
        return body


if not apps.ready and settings.DATABASE_FRONT_POOL:
    # This module starts the process (daphne): a front, whose requests each run on a new
    # thread, pools its connections (PostgreSQL: psycopg_pool; SQLite: fleetadmin/pooled_sqlite).
    # A process that imports it later (tests) keeps its own.
    use_connection_pool(settings.DATABASES, settings.DATABASE_FRONT_POOL)

django.setup(set_prefix=False)  # what get_asgi_application does, for our handler
django_asgi = FrontASGIHandler()

# Every submission's forecast checks the pool's config with the runpod SDK (pods/poolconfig.py):
# imported here, at start-up, not by the first uploads, which all waited on its import lock
# (py-spy on bench/ingest.py: ~40% of the front's samples in the first seconds of a run).
import pods.providers.runpod  # noqa: E402, F401
from ocrjobs.routing import websocket_urlpatterns as job_websockets  # noqa: E402  (needs the apps loaded)
from pods.routing import websocket_urlpatterns  # noqa: E402  (needs the apps loaded)


def _import_what_requests_use() -> None:
    """What the first requests would each import, imported at start-up: the URLconf with every
    view (~0.5 s of CPU), and the tasks a submission enqueues (the dispatch loop's aiohttp and its
    TLS context). Django imports the URLconf when it resolves the first request, on the event
    loop: for 0.5-1.9 s after each start no request, /healthz included, was answered (the
    dashboard's loop panel showed the stall after `make run`). bench/ingest.py counted it too."""
    # function-level: imported once the apps are loaded, before the first request (see above)
    import ocrjobs.tasks  # noqa: F401

    get_resolver().url_patterns  # noqa: B018  (the URLconf, imported on first use)
    get_resolver().reverse_dict  # noqa: B018  (the index {% url %} builds on first use)


_import_what_requests_use()

application = ProtocolTypeRouter(
    {
        "http": HealthzFirst(StaticPolicy(ASGIStaticFilesHandler(django_asgi))),
        "websocket": AllowedHostsOriginValidator(
            AuthMiddlewareStack(URLRouter([*websocket_urlpatterns, *job_websockets]))
        ),
    }
)

# Invariant 3: the front's loop is watched from its first connection on (daphne sends no lifespan event).
application = watch_loop(application, name="front", kind="front")

# What start-up made lives as long as the process: out of the collector's sight, so that a full
# collection (every few submissions) walks only what requests made (gc.freeze: ~150,000 objects
# that each gen-2 pass would walk, ~80 ms a pass on a 2-core machine).
gc.freeze()
