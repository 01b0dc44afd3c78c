"""The Content-Security-Policy of static files, which Django's static handler serves before any
middleware (fleetadmin/asgi.py), so django-csp never sees them.

A browser applies the policy a script's response carries only when the script runs as a worker's
own document: pdf.js's worker, which parses every PDF the viewer shows. Without one it ran with no
policy at all (eval allowed). It gets the pages' policy, with WebAssembly compilation allowed
(``'wasm-unsafe-eval'``: pdf.js decodes JBIG2 and JPEG 2000 scans with WebAssembly); eval stays
refused. On a page's own scripts and stylesheets the header has no effect.
"""

from __future__ import annotations

from django.conf import settings

HEADER = b"content-security-policy"


def header_value(directives: dict[str, list[str]]) -> bytes:
    return "; ".join(f"{name} {' '.join(values)}" for name, values in directives.items()).encode()


class StaticPolicy:
    """ASGI wrapper: a static file's answer (a path under ``STATIC_URL``) gets
    ``STATIC_CONTENT_SECURITY_POLICY`` unless it has a policy already."""

    def __init__(self, app) -> None:
        self.app = app
        self.prefix = settings.STATIC_URL if settings.STATIC_URL.startswith("/") else f"/{settings.STATIC_URL}"
        self.value = header_value(settings.STATIC_CONTENT_SECURITY_POLICY)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or not scope["path"].startswith(self.prefix):
            return await self.app(scope, receive, send)

        async def send_with_policy(message):
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                if not any(name.lower() == HEADER for name, _ in headers):
                    message = {**message, "headers": [*headers, (HEADER, self.value)]}
            await send(message)

        return await self.app(scope, receive, send_with_policy)
