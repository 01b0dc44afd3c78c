"""fleetadmin.healthz: GET /healthz answered by the ASGI application before Django, with
exactly what Django answered, and only for a host Django accepts."""

from __future__ import annotations

import asyncio
import json

import pytest
from asgiref.testing import ApplicationCommunicator
from django.core.asgi import get_asgi_application

from fleetadmin.healthz import HealthzFirst


class CountingApp:
    """Django's ASGI application, counting the requests that reach it."""

    def __init__(self) -> None:
        self.app = get_asgi_application()
        self.paths: list[str] = []

    async def __call__(self, scope, receive, send):
        self.paths.append(f"{scope['method']} {scope['path']}")
        return await self.app(scope, receive, send)


def _scope(path: str = "/healthz", method: str = "GET", host: bytes = b"127.0.0.1:8000") -> dict:
    return {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "scheme": "http",
        "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
        "headers": [(b"host", host)], "client": ("127.0.0.1", 50000), "server": ("127.0.0.1", 8000),
    }  # fmt: skip


def _request(app, scope: dict) -> tuple[int, dict[bytes, bytes], bytes]:
    return asyncio.run(_arequest(app, scope))


async def _arequest(app, scope: dict) -> tuple[int, dict[bytes, bytes], bytes]:
    communicator = ApplicationCommunicator(app, scope)
    await communicator.send_input({"type": "http.request", "body": b"", "more_body": False})
    start = await communicator.receive_output(10)
    body = b""
    while True:
        message = await communicator.receive_output(10)
        body += message.get("body", b"")
        if not message.get("more_body", False):
            break
    await communicator.wait(10)
    return start["status"], dict(start["headers"]), body


@pytest.fixture
def django_app() -> CountingApp:
    return CountingApp()


def test_healthz_is_answered_before_django_with_what_django_answered(django_app):
    app = HealthzFirst(django_app)

    through_django = _request(app, _scope())
    answers = [_request(app, _scope()) for _ in range(3)]

    assert django_app.paths == ["GET /healthz"]  # only the first request reached Django
    assert all(answer == through_django for answer in answers)
    status, headers, body = through_django
    assert status == 200 and json.loads(body) == {"status": "ok"}
    assert headers[b"Content-Type"] == b"application/json" and headers[b"X-Frame-Options"] == b"DENY"


def test_a_host_django_refuses_is_refused_by_django_every_time(django_app):
    app = HealthzFirst(django_app)
    _request(app, _scope())  # recorded for an allowed host

    for _ in range(2):
        status, _, _ = _request(app, _scope(host=b"evil.example"))
        assert status == 400
    assert django_app.paths == ["GET /healthz", "GET /healthz", "GET /healthz"]


def test_other_methods_and_paths_go_to_django(django_app):
    app = HealthzFirst(django_app)
    _request(app, _scope())

    _request(app, _scope(method="HEAD"))
    _request(app, _scope(path="/healthz/"))
    assert django_app.paths == ["GET /healthz", "HEAD /healthz", "GET /healthz/"]


def test_an_answer_other_than_a_plain_200_is_never_recorded():
    calls = []

    async def failing(scope, receive, send):
        calls.append(scope["path"])
        await send({"type": "http.response.start", "status": 503, "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": b"starting"})

    app = HealthzFirst(failing)
    assert (_request(app, _scope()))[0] == 503
    assert (_request(app, _scope()))[0] == 503
    assert calls == ["/healthz", "/healthz"] and app.recorded is None


def test_the_front_answers_healthz_first():
    from fleetadmin.asgi import application

    assert isinstance(application.app.application_mapping["http"], HealthzFirst)
