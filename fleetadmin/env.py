"""Strict readers for settings that come from the environment.

Each helper refuses a value it cannot read rather than guessing: a typo in a
deployment's environment should stop start-up, not change behaviour quietly.
Secrets may come from a file named by ``NAME_FILE`` (Docker and Kubernetes
secrets), which wins over ``NAME``.
"""

from __future__ import annotations

import os
from decimal import Decimal, InvalidOperation
from pathlib import Path


class EnvError(ValueError):
    pass


def _raw(name: str) -> str | None:
    value = os.environ.get(name)
    if value is None or value.strip() == "":
        return None
    return value.strip()


def envstr(name: str, default: str = "") -> str:
    value = _raw(name)
    return default if value is None else value


def envbool(name: str, default: bool = False) -> bool:
    value = _raw(name)
    if value is None:
        return default
    if value.lower() == "true":
        return True
    if value.lower() == "false":
        return False
    raise EnvError(f"{name} must be 'true' or 'false', not {value!r}")


def envint(name: str, default: int, *, minimum: int | None = None) -> int:
    value = _raw(name)
    if value is None:
        return default
    try:
        number = int(value)
    except ValueError:
        raise EnvError(f"{name} must be an integer, not {value!r}") from None
    if minimum is not None and number < minimum:
        raise EnvError(f"{name} must be at least {minimum}, not {number}")
    return number


def envfloat(name: str, default: float, *, minimum: float | None = None) -> float:
    value = _raw(name)
    if value is None:
        return default
    try:
        number = float(value)
    except ValueError:
        raise EnvError(f"{name} must be a number, not {value!r}") from None
    if minimum is not None and number < minimum:
        raise EnvError(f"{name} must be at least {minimum}, not {number}")
    return number


def envdollars(name: str, default: str | None) -> Decimal | None:
    """A dollar amount (cents at most) more than 0, or ``none`` for no limit."""
    value = _raw(name) or default
    if value is None or value.lower() == "none":
        return None
    try:
        dollars = Decimal(value)
    except InvalidOperation:
        raise EnvError(f"{name} must be dollars such as 20 or 2.50, or none, not {value!r}") from None
    if not dollars.is_finite() or dollars <= 0 or dollars != dollars.quantize(Decimal("0.01")):
        raise EnvError(f"{name} must be more than 0 with cents at most, or none, not {value!r}")
    return dollars


def envsecret(name: str, default: str = "") -> str:
    """``NAME_FILE`` (a path whose content is the secret) wins over ``NAME``."""
    path = _raw(f"{name}_FILE")
    if path is not None:
        try:
            return Path(path).read_text().strip()
        except OSError as exc:
            raise EnvError(f"{name}_FILE={path!r} cannot be read: {exc.strerror}") from None
    return envstr(name, default)


def envproxyheader(name: str) -> tuple[str, str] | None:
    """The request header by which a TLS-terminating proxy says a request came over HTTPS, as
    Django's ``SECURE_PROXY_SSL_HEADER`` takes it: ``HTTP_X_FORWARDED_PROTO`` (or
    ``X-Forwarded-Proto``) gives ``("HTTP_X_FORWARDED_PROTO", "https")``; unset gives None."""
    value = _raw(name)
    if value is None:
        return None
    header = value.upper().replace("-", "_")
    if not header.replace("_", "").isalnum() or not header.isascii():
        raise EnvError(f"{name} must be a header name such as HTTP_X_FORWARDED_PROTO, not {value!r}")
    return (header if header.startswith("HTTP_") else f"HTTP_{header}", "https")
