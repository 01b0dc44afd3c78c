"""Services raise domain errors (fleetadmin/errors.py); the API edge alone chooses statuses, from
one table (fleetadmin.api.STATUS_FOR)."""

from __future__ import annotations

import ast
import json

import pytest
from django.test import RequestFactory

import ocrjobs.schemas  # noqa: F401  (its SubmissionInvalid is a kind of Invalid: counted below)
from fleetadmin import errors
from fleetadmin.api import STATUS_FOR, api_view, kind_status, status_for
from tools.processes import REPO

SERVICE_PACKAGES = ("ocrjobs/services", "pods/services")


def _kinds(base: type) -> list[type]:
    found = []
    for kind in base.__subclasses__():
        found += [kind, *_kinds(kind)]
    return found


def test_every_domain_error_kind_has_a_status_in_the_one_table():
    own_kinds = [kind for kind in _kinds(errors.DomainError) if kind.__module__ == errors.__name__]

    assert len(own_kinds) >= 8
    assert [kind.__name__ for kind in own_kinds if kind not in STATUS_FOR] == []
    for kind in _kinds(errors.DomainError):  # the apps' own kinds derive from one that has a status
        assert kind_status(kind) in range(400, 500), kind


def test_a_domain_error_without_a_kind_in_the_table_is_refused_not_answered_500_quietly():
    with pytest.raises(TypeError, match="has no status"):
        status_for(errors.DomainError("x"))


@pytest.mark.parametrize(
    ("kind", "status"),
    [(errors.Invalid, 400), (errors.Forbidden, 403), (errors.NotFound, 404), (errors.Conflict, 409),
     (errors.TooLarge, 413), (errors.UnsupportedType, 415), (errors.Unprocessable, 422),
     (errors.QuotaExceeded, 429), (errors.RemoteFailed, 400)],
)  # fmt: skip
@pytest.mark.django_db
def test_the_api_answers_a_domain_error_with_its_kinds_status_and_the_services_words(kind, status, admin_user):
    @api_view(scope="read")
    def view(request):
        raise kind("pool 'gpu' is not open to you", field="pool")

    request = RequestFactory().get("/v1/anything")
    request.user = admin_user

    response = view(request)

    assert response.status_code == status
    assert json.loads(response.content) == {"error": "pool 'gpu' is not open to you"}


def _status_choices(source: str) -> list[str]:
    """What in a module's source chooses an HTTP status: ApiError, the API module, django.http,
    an ``http_status``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module in ("fleetadmin.api", "django.http"):
            found.append(f"from {node.module} import …")
        elif isinstance(node, ast.Import) and any(a.name in ("fleetadmin.api", "django.http") for a in node.names):
            found.append("import of the API module or django.http")
        elif isinstance(node, ast.Name) and node.id == "ApiError":
            found.append("ApiError")
    if "http_status" in source:
        found.append("http_status")
    return found


def test_no_service_module_raises_api_error_or_mentions_an_http_status():
    modules = sorted(path for package in SERVICE_PACKAGES for path in (REPO / package).rglob("*.py"))

    assert len(modules) > 20
    found = {str(path.relative_to(REPO)): _status_choices(path.read_text()) for path in modules}
    assert {name: choices for name, choices in found.items() if choices} == {}


def test_the_status_check_finds_a_service_that_chooses_a_status():
    source = 'from fleetadmin.api import ApiError\n\ndef f():\n    raise ApiError("no", 409)\n'

    assert _status_choices(source) == ["from fleetadmin.api import …", "ApiError"]
    assert _status_choices("def f(http_status=409):\n    pass\n") == ["http_status"]
