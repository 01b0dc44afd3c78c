"""``GET /healthz`` answered by the front's ASGI application, before Django.

Through Django, even an async view costs the request signals and every middleware,
each hop on a thread (``sync_to_async``): a few milliseconds on an idle front, and
seconds on one whose threads and CPU are busy, which is when a health check
matters. Here it costs nothing but the loop: it answers as long as the loop runs.

What it answers is what Django answered: the first ``GET /healthz`` goes through
Django (the view in ``fleetadmin/urls.py`` and the middleware's headers) and its
200 is recorded; later ones get the recording. Only a host Django accepts is
answered here; anything else (another method, a refused host, a response with a
cookie or another status) goes to Django every time.
"""

from __future__ import annotations

import io

from django.core.exceptions import DisallowedHost
from django.core.handlers.asgi import ASGIRequest

PATH = "/healthz"


class HealthzFirst:
    """ASGI wrapper: ``application = HealthzFirst(django_application)``."""

    def __init__(self, app, *, path: str = PATH) -> None:
        self.app = app
        self.path = path
        self.recorded: tuple[dict, bytes] | None = None  # Django's answer: (response start, body)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["path"] != self.path or scope["method"] != "GET":
            return await self.app(scope, receive, send)
        if not _host_allowed(scope):
            return await self.app(scope, receive, send)  # Django refuses it, in its own words
        if self.recorded is None:
            return await self.app(scope, receive, self._recording(send))
        start, body = self.recorded
        await send(start)
        await send({"type": "http.response.body", "body": body})

    def _recording(self, send):
        messages: list[dict] = []

        async def record(message: dict) -> None:
            messages.append(message)
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                self._keep(messages)

        return record

    def _keep(self, messages: list[dict]) -> None:
        start, *chunks = messages
        headers = {name.lower() for name, _ in start.get("headers", [])}
        if start["type"] != "http.response.start" or start["status"] != 200 or b"set-cookie" in headers:
            return
        body = b"".join(chunk.get("body", b"") for chunk in chunks if chunk["type"] == "http.response.body")
        self.recorded = ({"type": "http.response.start", "status": 200, "headers": list(start["headers"])}, body)


def _host_allowed(scope) -> bool:
    """Django's own host check (ALLOWED_HOSTS, DEBUG, X-Forwarded-Host) on the request's headers."""
    try:
        ASGIRequest(scope, io.BytesIO()).get_host()
    except DisallowedHost:
        return False
    return True
