"""Django's middleware, run on the front's event loop where it cannot block it.

Under ASGI, Django runs each ``MiddlewareMixin`` middleware's ``process_request`` and
``process_response`` on a thread (``sync_to_async``), and each ``process_view`` too: with the nine
in settings.MIDDLEWARE, up to twenty hops to a thread and back for every request, whatever its view,
each waiting for a thread and the GIL on a busy front. (bench/ingest.py's CPU did not move
measurably: its 70 requests carry 785 MB, and the front's CPU goes with the bytes.) Most of these
hooks only read headers and cookies and set headers, so
each class here calls the same hooks on the loop, and hops to a thread (as Django would) only in
the cases where a hook may touch the database or read a body:

- the session, when it was modified (or settings.SESSION_SAVE_EVERY_REQUEST): it is saved;
- the messages, when they were read or added: they are stored, perhaps in the session;
- CSRF, on a form's POST (its token may be in the body), and with settings.CSRF_USE_SESSIONS.

A request to an async view (``GET /v1/runpod/status``) then runs on the loop from end to end; a sync view
takes one hop, its own. Without an event loop (the test client, ``manage.py``) each class is the
Django middleware it extends, unchanged. Only the public middleware hooks are used.
``manage.py check --deploy`` counts each as the Django class it extends (fleetadmin/checks.py).
"""

from __future__ import annotations

from asgiref.sync import iscoroutinefunction, sync_to_async
from csp.middleware import CSPMiddleware
from django.conf import settings
from django.contrib.auth.middleware import AuthenticationMiddleware
from django.contrib.messages.middleware import MessageMiddleware
from django.contrib.sessions.middleware import SessionMiddleware
from django.middleware.clickjacking import XFrameOptionsMiddleware
from django.middleware.common import CommonMiddleware
from django.middleware.csrf import CsrfViewMiddleware
from django.middleware.security import SecurityMiddleware


def _on_a_thread(hook):
    return sync_to_async(hook, thread_sensitive=True)


class OnTheLoop:
    """Put first among a ``MiddlewareMixin`` middleware's bases: in async mode its hooks run on
    the loop, except where ``request_needs_thread``/``response_needs_thread`` say otherwise."""

    def __call__(self, request):
        if iscoroutinefunction(self):  # MiddlewareMixin marked it: the handler is async
            return self._acall_on_the_loop(request)
        return super().__call__(request)

    def request_needs_thread(self, request) -> bool:
        return False

    def response_needs_thread(self, request, response) -> bool:
        return False

    async def _acall_on_the_loop(self, request):
        response = None
        process_request = getattr(self, "process_request", None)
        if process_request is not None:
            if self.request_needs_thread(request):
                response = await _on_a_thread(process_request)(request)
            else:
                response = process_request(request)
        response = response or await self.get_response(request)
        process_response = getattr(self, "process_response", None)
        if process_response is not None:
            if self.response_needs_thread(request, response):
                response = await _on_a_thread(process_response)(request, response)
            else:
                response = process_response(request, response)
        return response


class LoopSecurityMiddleware(OnTheLoop, SecurityMiddleware):
    pass


class LoopSessionMiddleware(OnTheLoop, SessionMiddleware):
    def response_needs_thread(self, request, response) -> bool:
        session = getattr(request, "session", None)
        return session is not None and (session.modified or settings.SESSION_SAVE_EVERY_REQUEST)


class LoopCommonMiddleware(OnTheLoop, CommonMiddleware):
    pass


class LoopCsrfViewMiddleware(OnTheLoop, CsrfViewMiddleware):
    """Its ``process_view`` too runs on the loop, but for a POST that is not exempt (whose token
    may be in the body) or with the secret in the session."""

    def __init__(self, get_response):
        super().__init__(get_response)
        if iscoroutinefunction(self):
            # The handler adapts process_view by what it is: a coroutine function runs on the loop.
            self.process_view = self._aprocess_view

    async def _aprocess_view(self, request, callback, callback_args, callback_kwargs):
        view_check = super().process_view  # (Django's: self.process_view is this coroutine)
        loop_safe = not settings.CSRF_USE_SESSIONS and (
            getattr(callback, "csrf_exempt", False) or request.method in ("GET", "HEAD", "OPTIONS", "TRACE")
        )
        if loop_safe:
            return view_check(request, callback, callback_args, callback_kwargs)
        return await _on_a_thread(view_check)(request, callback, callback_args, callback_kwargs)

    def request_needs_thread(self, request) -> bool:
        return settings.CSRF_USE_SESSIONS

    def response_needs_thread(self, request, response) -> bool:
        return settings.CSRF_USE_SESSIONS


class LoopAuthenticationMiddleware(OnTheLoop, AuthenticationMiddleware):
    """Sets ``request.user`` lazily: nothing is read until a view asks."""


class LoopMessageMiddleware(OnTheLoop, MessageMiddleware):
    def response_needs_thread(self, request, response) -> bool:
        storage = getattr(request, "_messages", None)
        return storage is not None and (storage.used or storage.added_new)


class LoopXFrameOptionsMiddleware(OnTheLoop, XFrameOptionsMiddleware):
    pass


class LoopCSPMiddleware(OnTheLoop, CSPMiddleware):
    pass
