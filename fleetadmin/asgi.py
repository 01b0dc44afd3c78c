"""The front: Django over daphne, static files served by the ASGI handler
(plain daphne serves no /static/)."""

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "fleetadmin.settings")

from channels.routing import ProtocolTypeRouter
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler
from django.core.asgi import get_asgi_application

django_asgi = get_asgi_application()

application = ProtocolTypeRouter({"http": ASGIStaticFilesHandler(django_asgi)})
