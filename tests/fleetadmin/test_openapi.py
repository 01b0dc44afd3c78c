"""GET /v1/openapi.json describes every route under /v1/ with the methods it answers, and the
request bodies with the pydantic models that validate them."""

from __future__ import annotations

import json
import re

import pytest
from django.urls import resolve

from fleetadmin.openapi import openapi, v1_routes
from ocrjobs.schemas import JobSubmission
from pods.api import ScaleBody


@pytest.fixture
def spec(client, read_token) -> dict:
    response = client.get("/v1/openapi.json", headers={"Authorization": f"Bearer {read_token}"})
    assert response.status_code == 200
    assert response["Content-Type"] == "application/json"
    return json.loads(response.content)


def test_every_route_under_v1_is_described_with_its_methods(spec):
    routes = v1_routes()
    assert len(routes) >= 16  # the walk finds the routes (a broken walk would pass vacuously)
    for path, name, view in routes:
        described = spec["paths"].get(path)
        assert described is not None, f"{path} ({name}) is not in openapi.json"
        assert set(described) == {m.lower() for m in getattr(view, "api_methods", ("GET",))}, path


def test_every_described_path_is_a_real_route(spec):
    for path in spec["paths"]:
        concrete = re.sub(r"{\w+}", "1", path)
        assert resolve(concrete).url_name, path


def test_it_is_openapi_3_1_with_the_bodies_from_the_validating_models(spec):
    assert spec["openapi"] == "3.1.0"
    submit = spec["paths"]["/v1/jobs"]["post"]["requestBody"]["content"]
    assert submit["application/json"]["schema"] == json.loads(json.dumps(JobSubmission.model_json_schema()))
    assert {"files", "languages", "dry_run", "callback_url", "deadline"} <= set(
        submit["multipart/form-data"]["schema"]["properties"]
    )
    scale = spec["paths"]["/v1/runpod/scale"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert scale == json.loads(json.dumps(ScaleBody.model_json_schema()))
    assert {p["name"] for p in spec["paths"]["/v1/jobs"]["get"]["parameters"]} == {"cursor", "limit"}


def test_an_endpoint_added_without_words_fails_the_build(monkeypatch):
    from fleetadmin import openapi as module

    openapi.cache_clear()
    monkeypatch.delitem(module.OPERATIONS, ("api-jobs-pages", "get"))
    try:
        with pytest.raises(KeyError):
            openapi()
    finally:
        openapi.cache_clear()


def test_the_description_needs_a_token_like_the_rest_and_answers_only_get(client, read_token):
    assert client.get("/v1/openapi.json").status_code == 401
    response = client.post("/v1/openapi.json", headers={"Authorization": f"Bearer {read_token}"})
    assert response.status_code == 405 and response.json()["error"]
