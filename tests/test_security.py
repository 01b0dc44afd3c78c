"""Security: every endpoint needs a caller, every API view a scope, forms need the CSRF token,
the RunPod key shows up nowhere, and secrets can come from files.

The anonymous-refusal walk reads the URL configuration itself, so an endpoint
added without auth fails it. The websocket's refusal of an anonymous
connection is in tests/pods/test_consumers.py.
"""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
import traceback
import uuid
from dataclasses import dataclass

import pytest
from django.apps import apps
from django.http import JsonResponse
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver, path
from django.urls.resolvers import RegexPattern, RoutePattern

from accounts.models import ApiToken
from ocrjobs.models import Job, Page
from pods.models import Alert, BootAttempt, Pod, Pool, pod_name
from pods.providers.runpod import RunPodProvider
from pods.services import lifecycle, reconcile
from runpodsim import SimConfig, SimulatorThread
from runpodsim.config import GpuTypeConfig
from tests.factories import PAGES_TRUTH, pdf_bytes
from tests.ocrjobs.helpers import assert_nothing_made, complete_all, split, submit
from tests.pods.helpers import boot_until_settled
from tests.runpod import use_simulator
from tools.processes import REPO

# The only URL names anybody may call without credentials. Keep it this small.
# (favicon: /favicon.ico, a redirect to the static icon, which any page may ask for, the login page's too)
PUBLIC = {"healthz", "login", "logout", "favicon"}
SCOPES = {"read", "submit", "webhooks", "admin"}
# A token that lacks the scope, for each scope (admin implies submit implies read; webhooks is the
# signing secret's alone).
LACKING = {"read": [], "submit": ["read"], "webhooks": ["submit"], "admin": ["submit", "webhooks"]}
SKIPPED_PREFIXES = ("admin/", "static/", "media/")


# --- walking the URL configuration --------------------------------------------------------------


@dataclass
class Endpoint:
    route: str
    url: str
    name: str | None
    callback: object

    @property
    def api_scope(self) -> str | None:
        return getattr(self.callback, "api_scope", None)


def _fill(route: str) -> str:
    """A concrete path for a route: every converter gets a plausible value."""
    values = {"int": "1", "str": "x", "slug": "x", "uuid": str(uuid.UUID(int=1)), "path": "x"}
    return re.sub(r"<(?:(\w+):)?\w+>", lambda m: values.get(m.group(1) or "str", "1"), route)


def endpoints(urlconf: str | None = None) -> list[Endpoint]:
    found: list[Endpoint] = []

    def walk(patterns, prefix: str) -> None:
        for entry in patterns:
            route = prefix + str(entry.pattern)
            if route.lstrip("^").startswith(SKIPPED_PREFIXES):
                continue
            if isinstance(entry, URLResolver):
                walk(entry.url_patterns, route)
                continue
            assert isinstance(entry, URLPattern)
            if isinstance(entry.pattern, RoutePattern):
                url = "/" + _fill(route)
            else:
                assert isinstance(entry.pattern, RegexPattern)
                # Regex routes: strip the anchors and fill every group with 1.
                url = "/" + re.sub(r"\(\?P<\w+>[^)]*\)", "1", route.replace("^", "").replace("$", ""))
            found.append(Endpoint(route, url, entry.name, entry.callback))

    walk(get_resolver(urlconf).url_patterns, "")
    return found


def _is_login_redirect(response) -> bool:
    return response.status_code == 302 and response["Location"].startswith("/login/")


def anonymous_problems(client: Client) -> list[str]:
    """Every endpoint outside PUBLIC that an anonymous caller is not refused by."""
    problems = []
    for endpoint in endpoints():
        if endpoint.name in PUBLIC:
            continue
        served = False
        for method in ("get", "post", "patch"):  # (a line's correction is PATCH alone)
            response = getattr(client, method)(endpoint.url)
            if response.status_code == 405:
                continue  # not served by this method: the other one must refuse
            served = True
            if endpoint.api_scope is not None:
                ok = response.status_code == 401 and list(json.loads(response.content)) == ["error"]
            else:
                ok = _is_login_redirect(response) or response.status_code == 403
            if not ok:
                problems.append(f"{method.upper()} {endpoint.url} ({endpoint.name}): {response.status_code}")
        if not served:
            problems.append(f"{endpoint.url} ({endpoint.name}): answered 405 to GET, POST and PATCH alike")
    return problems


def test_every_endpoint_but_healthz_login_and_logout_refuses_an_anonymous_caller(client, db):
    found = {e.name for e in endpoints()}
    # The walk really sees the project's endpoints (pages, API, metrics), not an empty list.
    assert {"home", "jobs-new", "pods-release", "api-jobs", "api-runpod-scale", "metrics"} <= found
    assert PUBLIC <= found

    assert anonymous_problems(client) == []
    assert client.get("/healthz").json() == {"status": "ok"}


def _leaky(request):
    return JsonResponse({"pods": []})


urlpatterns = [*get_resolver("fleetadmin.urls").url_patterns, path("v1/leaky", _leaky, name="api-leaky")]


def test_the_walk_catches_an_endpoint_added_without_auth(client, db, settings):
    settings.ROOT_URLCONF = __name__

    assert anonymous_problems(client) == [
        "GET /v1/leaky (api-leaky): 200",
        "POST /v1/leaky (api-leaky): 200",
        "PATCH /v1/leaky (api-leaky): 200",
    ]


# --- scopes ----------------------------------------------------------------------------------------


def _call(client: Client, url: str, token: str):
    """GET, or POST (then PATCH) with an empty JSON body when the view answers only that."""
    headers = {"Authorization": f"Bearer {token}"}
    response = client.get(url, headers=headers)
    if response.status_code == 405:
        response = client.post(url, "{}", content_type="application/json", headers=headers)
    if response.status_code == 405:
        response = client.patch(url, "{}", content_type="application/json", headers=headers)
    return response


def test_every_api_view_declares_a_known_scope(db):
    api = [e for e in endpoints() if e.api_scope is not None]
    assert len(api) >= 10
    assert {e.name: e.api_scope for e in api if e.api_scope not in SCOPES} == {}
    # Every JSON endpoint is an API view: only pages and the public ones are not.
    pages = {e.name for e in endpoints() if e.api_scope is None}
    assert not {name for name in pages if name and (name.startswith("api-") or name == "metrics")}


def test_a_token_without_the_views_scope_is_refused_with_403(client, admin_user):
    # Tokens of a staff user: the token's scopes decide, not who owns it.
    tokens = {scope: ApiToken.issue(user=admin_user, name=f"no {scope}", scopes=lacking)[1]
              for scope, lacking in LACKING.items()}  # fmt: skip
    full = ApiToken.issue(user=admin_user, name="all", scopes=["admin"])[1]
    checked = []
    for endpoint in endpoints():
        if endpoint.api_scope is None:
            continue
        refused = _call(client, endpoint.url, tokens[endpoint.api_scope])
        assert refused.status_code == 403, f"{endpoint.url}: {refused.status_code} {refused.content[:200]}"
        assert f"'{endpoint.api_scope}' scope" in refused.json()["error"]
        allowed = _call(client, endpoint.url, full)
        assert allowed.status_code not in (401, 403), f"{endpoint.url}: {allowed.content[:200]}"
        checked.append(endpoint.api_scope)
    assert set(checked) == SCOPES  # each kind of scope was exercised


# --- CSRF --------------------------------------------------------------------------------------------


@pytest.fixture
def staff_browser(admin_user) -> Client:
    client = Client(enforce_csrf_checks=True)
    client.force_login(admin_user)
    return client


def test_every_endpoint_refuses_a_session_post_without_the_csrf_token(staff_browser, local_pool):
    for endpoint in endpoints():
        if endpoint.name in PUBLIC:
            continue
        response = staff_browser.post(endpoint.url, {"x": "1"})
        if response.status_code == 405:
            continue  # a GET-only API view: nothing to forge
        assert response.status_code == 403, f"{endpoint.url}: {response.status_code}"
        assert b"CSRF" in response.content, endpoint.url


def _csrf(client: Client) -> str:
    client.get("/jobs/new")
    return client.cookies["csrftoken"].value


def test_the_job_form_refuses_a_post_without_the_csrf_token_and_makes_nothing(admin_user, media_root, local_pool):
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(admin_user)
    from django.core.files.uploadedfile import SimpleUploadedFile

    def form():
        return {"files": [SimpleUploadedFile("a.pdf", pdf_bytes(PAGES_TRUTH[:1]))], "pool": "local", "languages": "eng"}

    refused = browser.post("/jobs/new", form())

    assert refused.status_code == 403
    assert_nothing_made(media_root)
    accepted = browser.post("/jobs/new", {**form(), "csrfmiddlewaretoken": _csrf(browser)})
    assert accepted.status_code == 302 and Job.objects.count() == 1


def test_cancel_and_retry_buttons_refuse_a_post_without_the_csrf_token(ordinary_user, local_pool):
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(ordinary_user)
    failed_job = submit(ordinary_user, {"a.pdf": pdf_bytes(PAGES_TRUTH[:2])})
    split(failed_job)
    complete_all(failed_job, failures={(0, 2): "HTTP 500: boom"})
    running_job = submit(ordinary_user, {"b.pdf": pdf_bytes(PAGES_TRUTH[:1])})
    split(running_job)

    assert browser.post(f"/jobs/{running_job.pk}/cancel").status_code == 403
    assert browser.post(f"/jobs/{failed_job.pk}/retry").status_code == 403
    # the same through the JSON API with the session
    assert browser.post(f"/v1/jobs/{running_job.pk}/cancel").status_code == 403
    assert browser.post(f"/v1/jobs/{failed_job.pk}/retry").status_code == 403

    running_job.refresh_from_db()
    failed_job.refresh_from_db()
    assert running_job.status == Job.Status.RUNNING
    assert failed_job.status == Job.Status.PARTIAL
    assert failed_job.pages.get(number=2).status == Page.Status.FAILED

    token = _csrf(browser)
    assert browser.post(f"/jobs/{running_job.pk}/cancel", {"csrfmiddlewaretoken": token}).status_code == 302
    assert browser.post(f"/jobs/{failed_job.pk}/retry", {"csrfmiddlewaretoken": token}).status_code == 302
    running_job.refresh_from_db()
    assert running_job.status == Job.Status.CANCELLED
    assert failed_job.pages.get(number=2).status == Page.Status.PENDING


def test_admin_api_calls_from_a_staff_session_need_the_csrf_token(staff_browser, local_pool):
    pod = Pod.objects.create(pool=local_pool, name="fa-local-csrf", state=Pod.State.READY)
    for url, body in [("/v1/runpod/release", {"pod_id": pod.pk}), ("/v1/runpod/scale", {"pool": "local", "pods": 0})]:
        response = staff_browser.post(url, json.dumps(body), content_type="application/json")
        assert response.status_code == 403 and "CSRF" in response.json()["error"], url
    pod.refresh_from_db()
    assert pod.state == Pod.State.READY


# --- the RunPod key ------------------------------------------------------------------------------------


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []
        self.setFormatter(logging.Formatter("%(name)s %(levelname)s %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))  # the message, its arguments and any traceback


@pytest.fixture
def every_log_line():
    """Every log record at DEBUG and above, from every logger (works with or without pytest's logging plugin)."""
    handler = _Records()
    loggers = [logging.getLogger()] + [
        lg for lg in logging.root.manager.loggerDict.values() if isinstance(lg, logging.Logger) and not lg.propagate
    ]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.addHandler(handler)
        lg.setLevel(logging.DEBUG)
    yield handler.lines
    for lg, level in zip(loggers, levels, strict=True):
        lg.removeHandler(handler)
        lg.setLevel(level)


EMPTY, GOOD = "NVIDIA EMPTY 1", "NVIDIA GOOD 2"


def _simulator(api_key: str, faults: list[dict] | None = None) -> SimulatorThread:
    return SimulatorThread(SimConfig(
        api_key=api_key, boot_delay_s=0.1, model_load_s=0.1, page_latency_s=0.01,
        gpu_types=[GpuTypeConfig(id=EMPTY, display_name="empty", secure_price=0.1, capacity={"SECURE": {"EU-RO-1": 0}}),
                   GpuTypeConfig(id=GOOD, display_name="good", secure_price=0.3, capacity={"SECURE": {"EU-RO-1": 4}})],
        faults=faults or [],
    ))  # fmt: skip


def _boot(pool: Pool) -> Pod:
    pod = Pod.objects.create(pool=pool, name=pod_name(pool, uuid.uuid4().hex[:8]), lanes=pool.lanes_per_pod)
    return boot_until_settled(pod.pk)


def _errors_of(call) -> list[str]:
    try:
        call()
    except Exception as exc:
        return ["".join(traceback.format_exception(exc)), repr(exc)]
    return []


def test_the_runpod_key_appears_in_no_log_page_error_row_or_metric(
    monkeypatch, settings, tmp_path, admin_user, every_log_line
):
    # Read from RUNPOD_API_KEY or RUNPOD_API_KEY_FILE at start (the fresh-interpreter test below).
    marker = f"rpk-LEAKCHECK-{uuid.uuid4().hex}"
    settings.RUNPOD_API_KEY = marker
    assert RunPodProvider().api_key == marker
    settings.RUNPOD_RETRY_DELAYS = (0.01, 0.01)
    settings.POD_RUNNING_TIMEOUT_SECONDS = 1.0
    settings.POD_READY_TIMEOUT_SECONDS = 1.0
    settings.DEPLOYMENT_PREFIX = f"t{uuid.uuid4().hex[:6]}"
    pool = Pool.objects.create(key="gpu", provider="runpod", max_pods=2, lanes_per_pod=2, config={
        "image": "ghcr.io/example/pod:1",
        "candidates": [{"gpu_types": [EMPTY, GOOD], "cloud_type": "SECURE", "data_centers": ["EU-RO-1"]}]})  # fmt: skip
    errors: list[str] = []

    # 1. RunPod refuses the key (a simulator that expects another one).
    with _simulator("another-key") as sim:
        use_simulator(sim, monkeypatch, settings)
        refused = _boot(pool)
        errors += _errors_of(RunPodProvider().catalogue)
        errors += _errors_of(lambda: reconcile.reconcile(provider_name="runpod"))
        assert refused.state == Pod.State.FAILED and sim.stats()["auth_failures"] >= 1

    # 2. RunPod takes the key, and boots fail in every other way.
    faults = [
        {"kind": "http_error", "status": 503, "body": "json", "count": 3, "operation": "podFindAndDeployOnDemand"},
        {"kind": "http_error", "status": 502, "count": 2, "operation": "pod"},
        {"kind": "boot_stuck", "count": 1},
    ]
    with _simulator(marker, faults) as sim:
        use_simulator(sim, monkeypatch, settings)
        stuck = _boot(pool)  # 5xx on the cheapest, then a pod that never runs
        sim.set_faults([{"kind": "model_fail", "count": 1}])
        never_ready = _boot(pool)
        sim.set_faults([{"kind": "http_error", "status": 500, "count": 10}])
        errors += _errors_of(RunPodProvider().catalogue)
        errors += _errors_of(lambda: RunPodProvider().get("nosuchpod"))
        sim.set_faults([])
        # Only the boots above are meant to time out: this one gets limits no busy machine reaches.
        settings.POD_RUNNING_TIMEOUT_SECONDS = settings.POD_READY_TIMEOUT_SECONDS = 30.0
        ready = _boot(pool)
        assert stuck.state == never_ready.state == Pod.State.FAILED
        assert ready.state == Pod.State.READY  # the key really reached RunPod
        assert sim.stats()["auth_failures"] == 0
        outcomes = set(BootAttempt.objects.values_list("outcome", flat=True))
        assert {"transient", "no_capacity", "created"} <= outcomes

        # What people and scrapers see, while the pods are there.
        client = Client()
        client.force_login(admin_user)
        token = ApiToken.issue(user=admin_user, name="t", scopes=["admin"])[1]
        urls = ["/", "/dashboard/sections", "/jobs/", "/v1/runpod/status", "/v1/runpod/prices", "/v1/runpod/spend",
                "/v1/models", "/metrics"]  # fmt: skip
        for model in ("pod", "pool", "alert", "bootattempt", "capacityverdict", "pricecatalogue"):
            urls += [f"/admin/pods/{model}/"]
        urls += [f"/admin/pods/pod/{pod.pk}/change/" for pod in (refused, stuck, never_ready, ready)]
        pages = {}
        for url in urls:
            response = client.get(
                url, headers={"Authorization": f"Bearer {token}"} if url.startswith(("/v1", "/m")) else {}
            )
            assert response.status_code in (200, 503), url
            pages[url] = b"".join(response.streaming_content) if response.streaming else response.content
        lifecycle.pod_release_now(pod=ready, reason="test over")

    assert Alert.objects.filter(kind=Alert.Kind.AUTH).exists()  # the refusal was written down, without the key
    assert all(marker.encode() not in content for content in pages.values()), [
        u for u, c in pages.items() if marker.encode() in c
    ]
    rows = [(model.__name__, row) for model in apps.get_models() for row in model.objects.values()]
    assert [name for name, row in rows if marker in str(row)] == []
    assert [e for e in errors if marker in e] == []
    assert len(errors) >= 4
    assert [line for line in every_log_line if marker in line] == []
    assert any("RunPod" in line or "runpod" in line for line in every_log_line)  # the capture saw the failures


# --- secrets from files --------------------------------------------------------------------------------


def _settings_in_a_fresh_interpreter(tmp_path, code: str, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG")}
    clean.update(FLEETADMIN_VAR_DIR=str(tmp_path / "var"), DJANGO_SETTINGS_MODULE="fleetadmin.settings", **env)
    program = f"import django; django.setup(); from django.conf import settings; {code}"
    return subprocess.run([sys.executable, "-c", program], cwd=REPO, env=clean, capture_output=True, text=True,
                          timeout=120)  # fmt: skip


def test_settings_read_the_secret_key_from_secret_key_file_which_wins(tmp_path):
    secret = f"file-secret-{uuid.uuid4().hex}"
    (tmp_path / "secret").write_text(secret + "\n")

    result = _settings_in_a_fresh_interpreter(
        tmp_path, "print(settings.SECRET_KEY)", SECRET_KEY_FILE=str(tmp_path / "secret"), SECRET_KEY="from-the-env",
        DATABASE_URL="postgres://fa@127.0.0.1:5432/fa",  # a scaled-out deployment: the key is required
    )  # fmt: skip

    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == secret
    assert not (tmp_path / "var" / "secret_key").exists()  # nothing generated beside it


def test_an_unreadable_secret_key_file_stops_start_up_without_a_fallback(tmp_path):
    result = _settings_in_a_fresh_interpreter(
        tmp_path, "print(settings.SECRET_KEY)", SECRET_KEY_FILE=str(tmp_path / "missing"), SECRET_KEY="from-the-env"
    )

    assert result.returncode != 0
    assert f"SECRET_KEY_FILE={str(tmp_path / 'missing')!r} cannot be read" in result.stderr
    assert "from-the-env" not in result.stderr + result.stdout


def test_the_runpod_key_file_and_url_template_reach_the_provider_in_a_fresh_interpreter(tmp_path):
    key = f"rpk-{uuid.uuid4().hex}"
    (tmp_path / "runpod").write_text(key + "\n")

    result = _settings_in_a_fresh_interpreter(
        tmp_path,
        "from pods.providers.runpod import RunPodProvider; import hashlib; provider = RunPodProvider(); "
        "print(hashlib.sha256(provider.api_key.encode()).hexdigest()); print(provider.url_template)",
        RUNPOD_API_KEY_FILE=str(tmp_path / "runpod"),
        RUNPOD_API_KEY="env-key",
        RUNPOD_POD_URL_TEMPLATE="http://{ip}:{public_port}/pods/{pod_id}",
    )

    import hashlib

    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [
        hashlib.sha256(key.encode()).hexdigest(),
        "http://{ip}:{public_port}/pods/{pod_id}",
    ]
