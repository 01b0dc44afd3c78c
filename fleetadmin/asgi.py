"""The front: Django over daphne, static files served by the ASGI handler
(plain daphne serves no /static/)."""

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "fleetadmin.settings")

from channels.auth import AuthMiddlewareStack
from channels.routing import ProtocolTypeRouter, URLRouter
from channels.security.websocket import AllowedHostsOriginValidator
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler
from django.core.asgi import get_asgi_application

from fleetadmin.loopwatch import watch_loop

django_asgi = get_asgi_application()

from pods.routing import websocket_urlpatterns  # noqa: E402  (needs the apps loaded)

application = ProtocolTypeRouter(
    {
        "http": ASGIStaticFilesHandler(django_asgi),
        "websocket": AllowedHostsOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
    }
)

# Invariant 3: the front's loop is watched from its first connection on (daphne sends no lifespan event).
application = watch_loop(application, name="front", kind="front")
