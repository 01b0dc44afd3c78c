"""The front: Django over daphne, static files served by the ASGI handler
(plain daphne serves no /static/), ``GET /healthz`` answered before Django
(fleetadmin/healthz.py), and PostgreSQL connections from a pool."""

import os
import sys

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "fleetadmin.settings")

from channels.auth import AuthMiddlewareStack
from channels.routing import ProtocolTypeRouter, URLRouter
from channels.security.websocket import AllowedHostsOriginValidator
from django.apps import apps
from django.conf import settings
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler
from django.core.asgi import get_asgi_application

from fleetadmin.db import use_connection_pool
from fleetadmin.healthz import HealthzFirst
from fleetadmin.loopwatch import watch_loop

# Request bodies go from daphne to Django in chunks of this size (daphne's default, 8 KiB, made
# a 100 MB upload 12,800 messages through the loop and Django's body spool).
REQUEST_CHUNK_BYTES = 1024 * 1024


def _daphne_leaves_forms_to_django() -> None:
    """Twisted parses every multipart POST body into ``request.args`` with the email package before
    daphne hands the body to Django, which parses it again; daphne never reads ``args``. That first
    parse was ~80% of the front's CPU on uploads (bench/ingest.py, py-spy): turned off here, for
    requests of the daphne that serves this module; and bodies are handed over in larger chunks."""
    protocol = sys.modules.get("daphne.http_protocol")
    if protocol is None or getattr(protocol.WebRequest, "_forms_left_to_django", False):
        return
    original = protocol.WebRequest.__init__

    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        self._parsePOSTFormSubmission = False
        server = getattr(self, "server", None)
        if server is not None and server.request_buffer_size < REQUEST_CHUNK_BYTES:
            server.request_buffer_size = REQUEST_CHUNK_BYTES

    protocol.WebRequest.__init__ = __init__
    protocol.WebRequest._forms_left_to_django = True


_daphne_leaves_forms_to_django()

if not apps.ready and settings.DATABASE_FRONT_POOL:
    # This module starts the process (daphne): a front, whose requests each run on a new
    # thread, pools its connections. A process that imports it later (tests) keeps its own.
    use_connection_pool(settings.DATABASES, settings.DATABASE_FRONT_POOL)

django_asgi = get_asgi_application()

# Every submission's forecast checks the pool's config with the runpod SDK (pods/poolconfig.py):
# imported here, at start-up, not by the first uploads, which all waited on its import lock
# (py-spy on bench/ingest.py: ~40% of the front's samples in the first seconds of a run).
import pods.providers.runpod  # noqa: E402, F401
from pods.routing import websocket_urlpatterns  # noqa: E402  (needs the apps loaded)

application = ProtocolTypeRouter(
    {
        "http": HealthzFirst(ASGIStaticFilesHandler(django_asgi)),
        "websocket": AllowedHostsOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
    }
)

# Invariant 3: the front's loop is watched from its first connection on (daphne sends no lifespan event).
application = watch_loop(application, name="front", kind="front")
