"""The JSON API's shared parts: one error shape, one auth decorator, one JSON body parser.

HTTP statuses are chosen here and in the API views only: services raise domain errors
(fleetadmin/errors.py), and ``STATUS_FOR`` maps each kind to its status in one table.

A caller is a bearer token (``Authorization: Bearer fa_…``) with scopes, or
the browser's session: staff get every scope, other users read and submit.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import functools
import json
import logging
from dataclasses import dataclass
from importlib import import_module
from types import SimpleNamespace
from typing import TypeVar
from urllib.parse import urlencode

from asgiref.sync import sync_to_async
from django.conf import settings
from django.contrib.auth import get_user
from django.core.exceptions import RequestDataTooBig, TooManyFieldsSent, TooManyFilesSent
from django.db.models import Q, QuerySet
from django.http import HttpRequest, JsonResponse
from django.middleware.csrf import CsrfViewMiddleware
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt
from pydantic import BaseModel, ValidationError

from accounts.models import SCOPES, ApiToken, hash_token
from fleetadmin import errors

log = logging.getLogger(__name__)

LAST_USED_RESOLUTION_SECONDS = 60
MAX_JSON_BYTES = 10_000

Model = TypeVar("Model", bound=BaseModel)


def error(message: str, status: int = 400) -> JsonResponse:
    return JsonResponse({"error": message}, status=status)


class ApiError(Exception):
    """A refusal of the API layer itself (a request's shape, its caller): a message for a person
    and the HTTP status that fits it. ``api_view`` answers it as ``{"error": message}``.
    Services never raise it: they raise domain errors (fleetadmin/errors.py)."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.message = message
        self.status = status


# The one table from a domain error's kind to the status the API answers it with.
STATUS_FOR: dict[type[errors.DomainError], int] = {
    errors.Invalid: 400,
    errors.RemoteFailed: 400,
    errors.Forbidden: 403,
    errors.NotFound: 404,
    errors.Conflict: 409,
    errors.TooLarge: 413,
    errors.UnsupportedType: 415,
    errors.Unprocessable: 422,
    errors.QuotaExceeded: 429,
}


def status_for(exc: errors.DomainError) -> int:
    """The status of a domain error: its kind's, or the nearest kind it derives from."""
    return kind_status(type(exc))


def kind_status(kind: type[errors.DomainError]) -> int:
    for ancestor in kind.__mro__:
        if ancestor in STATUS_FOR:
            return STATUS_FOR[ancestor]
    raise TypeError(f"{kind.__name__} has no status in fleetadmin.api.STATUS_FOR")


def as_api_error(exc: errors.DomainError) -> ApiError:
    return ApiError(exc.message, status_for(exc))


def parse_json(request: HttpRequest, model: type[Model], *, max_bytes: int = MAX_JSON_BYTES) -> Model:
    """The request's JSON body as ``model``, or ApiError: 415 for another content type, 413 for
    a body over ``max_bytes``, 400 for a body that is not JSON or the first error pydantic finds."""
    if not request.content_type.startswith("application/json"):
        raise ApiError("send a JSON body (Content-Type: application/json)", 415)
    # Judged by its declared length first: reading a huge body would be Django's own HTML 400.
    try:
        declared = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        raise ApiError("the Content-Length header is not a number", 400) from None
    if declared > max_bytes:
        raise ApiError(f"the body is too large ({declared} bytes; the limit is {max_bytes})", 413)
    try:
        body = request.body
    except RequestDataTooBig:
        raise ApiError(f"the body is too large (the limit is {max_bytes} bytes)", 413) from None
    if len(body) > max_bytes:
        raise ApiError(f"the body is too large (the limit is {max_bytes} bytes)", 413)
    try:
        return model.model_validate_json(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "body"
        raise ApiError(f"{where}: {first['msg']}", 400) from None


DEFAULT_PAGE_LIMIT = 50
MAX_PAGE_LIMIT = 200


@dataclass(frozen=True)
class Cursor:
    """Where a listing goes on: after the row with id ``after`` (None: from the start), ``limit``
    rows at most. The cursor is opaque to clients: base64 of a small JSON object."""

    after: int | None
    limit: int

    @staticmethod
    def encode(after: int) -> str:
        return base64.urlsafe_b64encode(json.dumps({"after": after}).encode()).decode().rstrip("=")

    @classmethod
    def from_request(cls, request: HttpRequest) -> Cursor:
        unknown = set(request.GET) - {"cursor", "limit"}
        if unknown:
            raise ApiError(f"unknown query parameter {sorted(unknown)[0][:40]!r} (cursor, limit)", 400)
        raw_limit = request.GET.get("limit", str(DEFAULT_PAGE_LIMIT))
        if not raw_limit.isdigit() or not 1 <= int(raw_limit) <= MAX_PAGE_LIMIT:
            raise ApiError(f"limit must be a whole number from 1 to {MAX_PAGE_LIMIT}, not {raw_limit[:20]!r}", 400)
        raw = request.GET.get("cursor")
        if raw is None:
            return cls(None, int(raw_limit))
        try:
            after = json.loads(base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4)))["after"]
            if not isinstance(after, int) or isinstance(after, bool) or not 0 <= after < 2**63:
                raise ValueError
        except (ValueError, KeyError, TypeError, binascii.Error, UnicodeDecodeError):
            raise ApiError("the cursor is not one this API gave out: use the 'next' link as it is", 400) from None
        return cls(after, int(raw_limit))

    def page(self, rows: QuerySet, *, descending: bool = False) -> tuple[list, int | None]:
        """One page of ``rows`` in id order (newest first when ``descending``): the rows and the
        id the next page starts after (None at the end). Reads ``limit + 1`` rows, whatever the
        table holds: an index range on the primary key."""
        if self.after is not None:
            rows = rows.filter(pk__lt=self.after) if descending else rows.filter(pk__gt=self.after)
        found = list(rows.order_by("-pk" if descending else "pk")[: self.limit + 1])
        if len(found) > self.limit:
            return found[: self.limit], found[self.limit - 1].pk
        return found, None

    def next_url(self, path: str, next_after: int | None) -> str | None:
        if next_after is None:
            return None
        return f"{path}?{urlencode({'cursor': self.encode(next_after), 'limit': self.limit})}"


def _note_use(token: ApiToken) -> None:
    """Stamp ``last_used_at`` at most once a minute per token: a write on every request of a
    busy caller (a probe, a dashboard script) would queue behind the workers' writes."""
    now = timezone.now()
    stale = now - timezone.timedelta(seconds=LAST_USED_RESOLUTION_SECONDS)
    if token.last_used_at is not None and token.last_used_at > stale:
        return
    # The condition again in the UPDATE: of fronts racing on one stale stamp, only the first writes.
    ApiToken.objects.filter(pk=token.pk).filter(Q(last_used_at__isnull=True) | Q(last_used_at__lte=stale)).update(
        last_used_at=now
    )


def token_row(token: str) -> ApiToken | None:
    """The token's row (its user selected) if the token is known and its user active."""
    row = ApiToken.objects.select_related("user").filter(token_hash=hash_token(token.strip())).first()
    return row if row is not None and row.user.is_active else None


def uploader_id(*, authorization: str, session_key: str) -> int | None:
    """Who may send a large body, known from a request's headers alone (fleetadmin/front.py asks
    before it reads the body): the id of the user of a bearer token that may submit, or else of
    a logged-in session's active user; None for anyone else."""
    if authorization:
        kind, _, token = authorization.partition(" ")
        row = token_row(token) if kind.lower() == "bearer" and token.strip() else None
        return row.user_id if row is not None and row.allows("submit") else None
    if session_key:
        store = import_module(settings.SESSION_ENGINE).SessionStore(session_key)
        user = get_user(SimpleNamespace(session=store))  # (get_user reads request.session only)
        return user.pk if user.is_authenticated and user.is_active else None
    return None


def _caller(request: HttpRequest) -> tuple[object | None, set[str], bool]:
    """(user, scopes, by_token) of the request, or raise ApiError 401."""
    header = request.headers.get("Authorization", "")
    if header:
        kind, _, token = header.partition(" ")
        if kind.lower() != "bearer" or not token.strip():
            raise ApiError("the Authorization header must be 'Bearer <token>'", 401)
        row = token_row(token)
        if row is None:
            raise ApiError("unknown or revoked token", 401)
        _note_use(row)
        scopes = {s for s in SCOPES if row.allows(s)}
        if not row.user.is_staff:
            scopes.discard("admin")  # (admin is staff's: a user no longer staff keeps no admin token)
        return row.user, scopes, True
    user = getattr(request, "user", None)
    if user is not None and user.is_authenticated:
        scopes = set(SCOPES) if user.is_staff else {"read", "submit", "webhooks"}
        return user, scopes, False
    raise ApiError("authentication required: send 'Authorization: Bearer <token>' or log in", 401)


def _authorize(request: HttpRequest, scope: str, methods: tuple[str, ...]) -> None:
    """Raise ApiError unless the method is allowed and the caller holds the scope."""
    if request.method not in methods:
        raise ApiError(f"method {request.method} not allowed", 405)
    user, scopes, by_token = _caller(request)
    if not by_token and request.method not in ("GET", "HEAD", "OPTIONS"):
        # A session is a browser: it needs the CSRF token like any form.
        rejected = CsrfViewMiddleware(lambda r: None).process_view(request, None, (), {})
        if rejected is not None:
            raise ApiError("CSRF check failed", 403)
    if scope not in scopes:
        raise ApiError(f"this needs the {scope!r} scope", 403)
    request.api_user = user
    request.api_scopes = scopes


def _error_response(exc: ApiError, methods: tuple[str, ...]) -> JsonResponse:
    response = error(exc.message, exc.status)
    if exc.status == 405:
        response["Allow"] = ", ".join(methods)
    return response


# Django raises these on first touch of request.body / POST / FILES past its memory limits;
# left alone they become its HTML "Bad Request (400)" page.
_TOO_BIG = (RequestDataTooBig, TooManyFieldsSent, TooManyFilesSent)


def _too_big(exc: Exception) -> ApiError:
    return ApiError(f"the request is too large: {exc}", 413)


def api_view(*, scope: str, methods: tuple[str, ...] = ("GET",)):
    """Check method, caller and scope; answer errors as ``{"error": ...}``: an ApiError with its
    status, a domain error with its kind's (``STATUS_FOR``).

    Works on sync views and on async ones (which wait on the loop, holding no thread).
    """

    def decorate(view):
        if asyncio.iscoroutinefunction(view):

            @csrf_exempt
            @functools.wraps(view)
            async def async_wrapper(request: HttpRequest, *args, **kwargs):
                try:
                    await sync_to_async(_authorize)(request, scope, methods)
                    return await view(request, *args, **kwargs)
                except ApiError as exc:
                    return _error_response(exc, methods)
                except errors.DomainError as exc:
                    return _error_response(as_api_error(exc), methods)
                except _TOO_BIG as exc:
                    return _error_response(_too_big(exc), methods)

            async_wrapper.api_scope = scope
            async_wrapper.api_methods = methods
            return async_wrapper

        @csrf_exempt
        @functools.wraps(view)
        def wrapper(request: HttpRequest, *args, **kwargs):
            try:
                _authorize(request, scope, methods)
                return view(request, *args, **kwargs)
            except ApiError as exc:
                return _error_response(exc, methods)
            except errors.DomainError as exc:
                return _error_response(as_api_error(exc), methods)
            except _TOO_BIG as exc:
                return _error_response(_too_big(exc), methods)

        wrapper.api_scope = scope
        wrapper.api_methods = methods
        return wrapper

    return decorate
