"""System checks of our own, for ``manage.py check --deploy``.

Django's security checks find its middleware in MIDDLEWARE by dotted path. With
fleetadmin/middleware.py's classes there (each extends Django's), they would warn that each is
missing (W001-W003) and skip every check that needs one: HSTS, the SSL redirect,
X-Frame-Options, secure CSRF and session cookies. settings.SILENCED_SYSTEM_CHECKS silences those
three, and the session cookie's as they read without the middleware (W010, W013: with it, W012
and W015); ``check_middleware`` asks the same of the classes that extend Django's, and runs again
the checks the missing paths skipped, each class named as the Django class it extends.
"""

from __future__ import annotations

from django.conf import settings
from django.core import checks
from django.core.checks.security import base as security_checks
from django.core.checks.security import csrf as csrf_checks
from django.core.checks.security import sessions as session_checks
from django.utils.module_loading import import_string

NEEDS_MIDDLEWARE = (
    security_checks.check_sts, security_checks.check_sts_include_subdomains, security_checks.check_sts_preload,
    security_checks.check_content_type_nosniff, security_checks.check_ssl_redirect, security_checks.check_xframe_deny,
    security_checks.check_referrer_policy, security_checks.check_cross_origin_opener_policy,
    csrf_checks.check_csrf_cookie_secure, session_checks.check_session_cookie_secure,
    session_checks.check_session_cookie_httponly,
)  # fmt: skip
# The middleware Django's checks look for: (its path, the check it stands in for, what is lost without it)
DJANGOS = (
    ("django.middleware.security.SecurityMiddleware", "security.W001",
     "SECURE_HSTS_SECONDS, SECURE_SSL_REDIRECT and the other SECURE_* settings have no effect"),
    ("django.middleware.clickjacking.XFrameOptionsMiddleware", "security.W002",
     "pages are sent with no X-Frame-Options header"),
    ("django.middleware.csrf.CsrfViewMiddleware", "security.W003",
     "forms are not protected against cross-site request forgery"),
    ("django.contrib.sessions.middleware.SessionMiddleware", None, ""),
)  # fmt: skip


def as_django(path: str) -> str:
    """``path``, or the path of the Django middleware its class extends (one Django checks for)."""
    cls = import_string(path)
    return next((django for django, _, _ in DJANGOS if issubclass(cls, import_string(django))), path)


def check_middleware(app_configs, **kwargs) -> list[checks.CheckMessage]:
    """Django's middleware checks for --deploy, with a class extending Django's counted as it."""
    from django.test.utils import override_settings  # (a settings override for a check's run only)

    named = [as_django(path) for path in settings.MIDDLEWARE]
    found = [
        checks.Warning(
            f"neither {django} nor a class extending it is in MIDDLEWARE: {lost}", id=f"fleetadmin.W{stands_in[-3:]}"
        )
        for django, stands_in, lost in DJANGOS
        if stands_in and django not in named
    ]
    with override_settings(MIDDLEWARE=named):
        for check in NEEDS_MIDDLEWARE:
            found.extend(check(app_configs))
    return found
