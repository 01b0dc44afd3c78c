"""``GET /v1/openapi.json``: an OpenAPI 3.1 description of the JSON API.

Built from the routes themselves (every path under ``/v1/`` and the methods its ``api_view``
allows) and from the pydantic models that validate the bodies; this module adds only the
words. tests/fleetadmin/test_openapi.py checks that every route is described and nothing else is.
"""

from __future__ import annotations

import functools
import re

from django.http import HttpRequest, JsonResponse
from django.urls import URLPattern, URLResolver, get_resolver

from fleetadmin.api import api_view

CURSOR = [
    {"name": "cursor", "in": "query", "required": False, "schema": {"type": "string"},
     "description": "opaque: the `next` link of the previous page carries it"},
    {"name": "limit", "in": "query", "required": False,
     "schema": {"type": "integer", "minimum": 1, "maximum": 200, "default": 50}},
]  # fmt: skip
ERROR = {"type": "object", "properties": {"error": {"type": "string"}}, "required": ["error"]}

# (URL name, method) -> what the route does. Bodies name the pydantic model that validates them
# ("multipart": the model its form fields are parsed with; documents come as `files`).
OPERATIONS: dict[tuple[str, str], dict] = {
    ("api-openapi", "get"): {"summary": "This description"},
    ("api-jobs", "get"): {"summary": "The caller's jobs, newest first, a page at a time", "parameters": CURSOR},
    ("api-jobs", "post"): {
        "summary": "Submit a job (201), or its forecast with dry_run (200, nothing stored)",
        "description": "Documents as multipart `files` with the same fields as form fields, or URLs as JSON. "
        "`Idempotency-Key`: the same key and body within 24 h answers the first job (200); the same "
        "key with another body is refused (422).",
        "body": ("ocrjobs.schemas", "JobSubmission"),
        "multipart": ("ocrjobs.schemas", "SubmissionFields"),
        "parameters": [
            {
                "name": "Idempotency-Key",
                "in": "header",
                "required": False,
                "schema": {"type": "string", "maxLength": 255},
            }
        ],  # fmt: skip
        "scope": "submit",
    },
    ("api-jobs-detail", "get"): {"summary": "A job: status, page counts, documents, forecast, webhook deliveries"},
    ("api-jobs-pages", "get"): {"summary": "A job's pages with their results, a page at a time", "parameters": CURSOR},
    ("api-jobs-result-txt", "get"): {"summary": "The job's text, streamed", "content": "text/plain"},
    ("api-jobs-result-jsonl", "get"): {"summary": "One JSON record per page, streamed", "content": "application/jsonl"},
    ("api-jobs-result-md", "get"): {"summary": "The job's Markdown, streamed", "content": "text/markdown"},
    ("api-jobs-outputs-zip", "get"): {
        "summary": "The job's outputs as one zip, written as it is sent",
        "description": "result.txt, result.md, result.jsonl, and each document's .txt, .md, .jsonl, .hocr, "
        ".alto.xml and searchable .pdf (once built) under documents/.",
        "content": "application/zip",
    },
    ("api-documents-result-txt", "get"): {
        "summary": "A document's text, pages parted by form feeds",
        "content": "text/plain",
    },
    ("api-documents-result-md", "get"): {"summary": "A document's Markdown", "content": "text/markdown"},
    ("api-documents-result-jsonl", "get"): {"summary": "A document's page records", "content": "application/jsonl"},
    ("api-documents-result-hocr", "get"): {
        "summary": "A document's reading as hOCR",
        "description": "XHTML: an ocr_page a page, ocr_line and ocrx_word with their bbox (in the pixels the "
        "page was read at) and x_wconf. A word's box is its share of its line's by characters.",
        "content": "text/html",
    },
    ("api-documents-result-alto", "get"): {
        "summary": "A document's reading as ALTO v4 XML",
        "description": "Page, PrintSpace, TextBlock, TextLine and String with HPOS, VPOS, WIDTH, HEIGHT (pixels) "
        "and WC (0-1).",
        "content": "application/xml",
    },
    ("api-documents-result-pdf", "get"): {
        "summary": "A document's searchable PDF",
        "description": "The original pages with an invisible text layer, built when a job that asked for "
        "it (`searchable_pdf`) ends, or on its first download by the job's owner. 202 while it is being "
        "built (the first download of one not asked for starts its build; `Retry-After` says when to ask "
        "again); 409 when its build failed (the error says why), before the job has ended, or for another "
        "user's download of one not asked for.",
        "content": "application/pdf",
    },
    ("api-jobs-cancel", "post"): {"summary": "Cancel a job"},
    ("api-jobs-outputs-rebuild", "post"): {
        "summary": "Build a job's searchable PDFs (again) (202)",
        "description": "The job's owner only (403 otherwise), once the job is done, partial or cancelled "
        "with a page read (409 otherwise), OUTPUT_REBUILDS_PER_HOUR a user (429 past it). A build under way is overtaken: it stores nothing. The body is the job, each "
        "document's `outputs.pdf.state` back to `pending`.",
        "scope": "submit",
    },
    ("api-jobs-line", "patch"): {
        "summary": "Correct a line of a page read",
        "description": "The job's owner or staff (403 otherwise); `{page_id}` is a page's `id` in "
        "`/v1/jobs/{id}/pages`, `{line}` its line's index in `lines`. The outputs (result.txt, .md, "
        ".jsonl, the searchable PDF) read the corrected text; the engine's reading stays as the line's "
        "and the page's `engine_text`. A searchable PDF built before is built again. 404 for no such page "
        "or line, 409 for a page not read, 400 for an empty or multi-line text.",
        "body": ("ocrjobs.schemas", "LineCorrectionBody"),
        "scope": "submit",
    },
    ("api-jobs-retry", "post"): {"summary": "Retry a partial or failed job's failed pages and documents"},
    ("api-webhooks-secret", "get"): {"summary": "The caller's webhook signing secret"},
    ("api-webhooks-secret-rotate", "post"): {
        "summary": "A new webhook signing secret; the one before signs too for a grace period"
    },
    ("api-runpod-status", "get"): {"summary": "The fleet: pools, pods, backlog, alerts"},
    ("api-runpod-prices", "get"): {"summary": "The GPU price catalogue"},
    ("api-runpod-scale", "post"): {
        "summary": "Scale a pool (answers within wait_s)",
        "body": ("pods.api", "ScaleBody"),
    },
    ("api-runpod-scale-detail", "get"): {"summary": "A scale request's result"},
    ("api-runpod-release", "post"): {"summary": "Release one pod", "body": ("pods.api", "ReleaseBody")},
    ("api-runpod-spend", "get"): {"summary": "Spend by pod, pool and job"},
    ("api-models", "get"): {"summary": "What each ready pod runs"},
}


def v1_routes() -> list[tuple[str, str, object]]:
    """(OpenAPI path, URL name, view) of every route under /v1/."""
    found = []

    def walk(patterns, prefix: str) -> None:
        for pattern in patterns:
            route = prefix + str(pattern.pattern)
            if isinstance(pattern, URLResolver):
                walk(pattern.url_patterns, route)
            elif isinstance(pattern, URLPattern) and route.startswith("v1/"):
                found.append(("/" + re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", route), pattern.name, pattern.callback))

    walk(get_resolver().url_patterns, "")
    return found


def _model(location: tuple[str, str]):
    import importlib

    module, name = location
    return getattr(importlib.import_module(module), name)


FILES = {
    "type": "array",
    "items": {"type": "string", "contentMediaType": "application/octet-stream"},
    "description": "the documents: PDF, PNG, JPEG or TIFF (also accepted as `file`)",
}


def multipart_schema(model) -> dict:
    """A model's fields as multipart form fields, typed as the model parses their text: a
    field's JSON type without null (a form cannot send null: leave the field out), and the
    documents as ``files``."""
    schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
    properties = {}
    for name, field in schema["properties"].items():
        field = dict(field)
        types = [option for option in field.pop("anyOf", []) if option.get("type") != "null"]
        if len(types) == 1:
            field = {**types[0], **field}
        elif types:
            field["anyOf"] = types
        if field.get("default", "") is None:
            del field["default"]
        properties[name] = field
    return {"type": "object", "properties": {**properties, "files": FILES}}


def _operation(name: str, method: str, view, path: str) -> dict:
    spec = OPERATIONS[(name, method)]
    operation: dict = {"operationId": f"{name}-{method}", "summary": spec["summary"]}
    if "description" in spec:
        operation["description"] = spec["description"]
    parameters = [{"name": p, "in": "path", "required": True, "schema": {"type": "integer"}}
                  for p in re.findall(r"{(\w+)}", path)] + spec.get("parameters", [])  # fmt: skip
    if parameters:
        operation["parameters"] = parameters
    if "body" in spec:
        schema = _model(spec["body"]).model_json_schema(ref_template="#/components/schemas/{model}")
        content = {"application/json": {"schema": schema}}
        if "multipart" in spec:
            content["multipart/form-data"] = {"schema": multipart_schema(_model(spec["multipart"]))}
        operation["requestBody"] = {"required": True, "content": content}
    ok = {"content": {spec.get("content", "application/json"): {}}, "description": "OK"}
    operation["responses"] = {
        "200": ok,
        **({"201": {"description": "Created", "content": {"application/json": {}}}} if method == "post" else {}),
        "4XX": {"description": "Refused", "content": {"application/json": {"schema": ERROR}}},
    }
    operation["security"] = [{"bearer": []}]
    operation["x-scope"] = spec.get("scope", getattr(view, "api_scope", "read"))
    return operation


@functools.cache
def openapi() -> dict:
    paths: dict[str, dict] = {}
    for path, name, view in v1_routes():
        for method in getattr(view, "api_methods", ("GET",)):
            paths.setdefault(path, {})[method.lower()] = _operation(name, method.lower(), view, path)
    return {
        "openapi": "3.1.0",
        "info": {"title": "fleetadmin", "version": "1",
                 "description": "Batch OCR on a fleet of GPU pods. Every error is {\"error\": \"...\"}."},
        "components": {"securitySchemes": {"bearer": {"type": "http", "scheme": "bearer",
                                                      "description": "an API token: manage.py apitoken"}}},
        "paths": paths,
    }  # fmt: skip


@api_view(scope="read")
def openapi_json(request: HttpRequest) -> JsonResponse:
    # Behind a token like every endpoint but /healthz (tests/test_security.py).
    return JsonResponse(openapi())
