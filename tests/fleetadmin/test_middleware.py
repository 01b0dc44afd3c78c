"""The middleware on the front's event loop (fleetadmin/middleware.py, issue 37): under an async
handler a request hops to a thread only for its own view's sync code, and for the session,
messages and CSRF work that may read the database or a body; and each middleware still does what
Django's does. Every hop any code makes is counted (asgiref's ``SyncToAsync``); each test fails
on Django's own middleware, which hops for every hook."""

from __future__ import annotations

import pytest
from asgiref.sync import SyncToAsync, async_to_sync
from django.conf import settings
from django.contrib import messages
from django.http import HttpResponse
from django.middleware.csrf import get_token
from django.test import AsyncClient
from django.urls import path
from django.views.decorators.csrf import csrf_exempt

from fleetadmin import middleware
from fleetadmin.checks import check_middleware
from pods import selectors


async def on_the_loop(request):
    return HttpResponse("loop")


def on_a_thread(request):
    return HttpResponse("thread")


def keeps_a_session(request):
    request.session["visits"] = request.session.get("visits", 0) + 1
    return HttpResponse(str(request.session["visits"]))


def leaves_a_message(request):
    messages.info(request, "hello")
    return HttpResponse("noted")


def hands_out_a_token(request):
    return HttpResponse(get_token(request))


def a_form(request):
    return HttpResponse(request.POST.get("name", ""))


@csrf_exempt
def exempt_form(request):
    return HttpResponse(request.POST.get("name", ""))


urlpatterns = [
    path("loop", on_the_loop),
    path("thread", on_a_thread),
    path("session", keeps_a_session),
    path("message", leaves_a_message),
    path("token", hands_out_a_token),
    path("form", a_form),
    path("exempt", exempt_form),
]


# Django's ASGI handler's own, on every request whatever the middleware: the request_started
# signal's sync receivers, and the response's close (request_finished).
HANDLER_HOPS = {"sync_send", "close"}


@pytest.fixture
def hops(monkeypatch) -> list[str]:
    """The name of each function other code ran on a thread from the loop, in order."""
    seen: list[str] = []
    original = SyncToAsync.__call__

    async def counted(self, *args, **kwargs):
        name = getattr(self.func, "__name__", repr(self.func))
        if name not in HANDLER_HOPS:
            seen.append(name)
        return await original(self, *args, **kwargs)

    monkeypatch.setattr(SyncToAsync, "__call__", counted)
    return seen


def test_the_settings_run_each_django_middleware_on_the_loop():
    loop_safe = [path for path in settings.MIDDLEWARE if path.startswith("fleetadmin.middleware.")]
    assert len(loop_safe) == 8, settings.MIDDLEWARE
    for dotted in loop_safe:
        assert issubclass(getattr(middleware, dotted.rsplit(".", 1)[1]), middleware.OnTheLoop)


@pytest.mark.urls(__name__)
def test_a_request_to_an_async_view_never_leaves_the_loop(db, hops):
    response = async_to_sync(AsyncClient().get)("/loop")
    assert response.status_code == 200
    assert response.content == b"loop"
    assert response.headers["X-Frame-Options"] == "DENY"  # the middleware did run
    assert "Content-Security-Policy" in response.headers
    assert hops == []


@pytest.mark.urls(__name__)
def test_a_sync_view_takes_one_hop_its_own(db, hops):
    response = async_to_sync(AsyncClient().get)("/thread")
    assert response.content == b"thread"
    assert response.headers["X-Content-Type-Options"] == "nosniff"
    assert hops == ["on_a_thread"]


@pytest.mark.urls(__name__)
def test_a_session_a_view_changed_is_saved_on_a_thread_and_read_back(db, hops):
    client = AsyncClient()
    assert async_to_sync(client.get)("/session").content == b"1"
    assert hops == ["keeps_a_session", "process_response"]
    assert settings.SESSION_COOKIE_NAME in client.cookies
    assert async_to_sync(client.get)("/session").content == b"2"


@pytest.mark.urls(__name__)
def test_a_message_a_view_left_is_stored(db, hops):
    client = AsyncClient()
    response = async_to_sync(client.get)("/message")
    assert hops == ["leaves_a_message", "process_response"]
    assert response.cookies["messages"].value


@pytest.mark.urls(__name__)
def test_a_form_posted_without_its_csrf_token_is_refused_and_with_it_accepted(db, hops):
    client = AsyncClient(enforce_csrf_checks=True)
    token = async_to_sync(client.get)("/token").content.decode()
    assert async_to_sync(client.post)("/form", {"name": "ada"}).status_code == 403
    hops.clear()
    accepted = async_to_sync(client.post)("/form", {"name": "ada", "csrfmiddlewaretoken": token})
    assert accepted.status_code == 200
    assert accepted.content == b"ada"
    # The token may be in the body: the check reads it on a thread, then the view runs on one.
    assert hops == ["process_view", "a_form"]


@pytest.mark.urls(__name__)
def test_an_exempt_post_takes_only_its_views_hop(db, hops):
    response = async_to_sync(AsyncClient(enforce_csrf_checks=True).post)("/exempt", {"name": "ada"})
    assert response.content == b"ada"
    assert hops == ["exempt_form"]


def test_the_fleet_status_is_answered_with_one_hop_for_the_token(read_token, hops):
    selectors.fleet_status_snapshot.get()  # a young snapshot: answered from the loop
    hops.clear()
    response = async_to_sync(AsyncClient().get)("/v1/runpod/status", headers={"Authorization": f"Bearer {read_token}"})
    assert response.status_code == 200, response.content
    assert "pools" in response.json()
    assert hops == ["_authorize"]


def test_check_deploy_counts_these_classes_as_djangos_and_still_checks_what_needs_them(settings):
    settings.SECURE_HSTS_SECONDS = 0
    settings.CSRF_COOKIE_SECURE = False
    found = {message.id for message in check_middleware(None)}
    assert {"security.W004", "security.W016"} <= found  # skipped by Django's own run: no path matched
    assert not {"fleetadmin.W001", "fleetadmin.W002", "fleetadmin.W003"} & found


def test_check_deploy_says_when_a_protection_is_missing(settings):
    settings.MIDDLEWARE = [path for path in settings.MIDDLEWARE if "Csrf" not in path]
    found = {message.id for message in check_middleware(None)}
    assert "fleetadmin.W003" in found
    settings.MIDDLEWARE = [*settings.MIDDLEWARE, "django.middleware.csrf.CsrfViewMiddleware"]  # Django's own counts
    assert "fleetadmin.W003" not in {message.id for message in check_middleware(None)}
