"""Deployment settings: a scaled-out deployment is HTTPS-only by default and passes
``manage.py check --deploy`` with docs/scaling-out.md's production environment; the embedded default serves
plain HTTP on loopback as it always has; a front behind a TLS-terminating proxy knows a request
came over HTTPS from the proxy's header alone."""

from __future__ import annotations

import json
import re
import secrets
import shlex
import subprocess
import sys

import httpx
import pytest

from tools.processes import REPO, child_env, start_front

# docs/scaling-out.md's environment (its `export` lines), as a production deployment sets it;
# test_the_scaling_out_page_sets_what_this_test_checks keeps the two the same.
PRODUCTION_ENV = {
    "DATABASE_URL": "postgres://fleetadmin@db:5432/fleetadmin",
    "REDIS_URL": "redis://redis:6379/0",
    "SECRET_KEY_FILE": "/run/secrets/secret_key",
    "ALLOWED_HOSTS": "ocr.example.net",
    "CSRF_TRUSTED_ORIGINS": "https://ocr.example.net",
    "SECURE_PROXY_SSL_HEADER": "HTTP_X_FORWARDED_PROTO",
    "SECURE_HSTS_PRELOAD": "true",
    "STORAGE_S3_BUCKET": "fleetadmin-documents",
    "STORAGE_S3_ENDPOINT_URL": "https://s3.example.net",
    "STORAGE_S3_ADDRESSING_STYLE": "path",
    "AWS_ACCESS_KEY_ID": "...",
    "AWS_SECRET_ACCESS_KEY_FILE": "/run/secrets/s3",
}
SHOW = (
    "import json, fleetadmin.settings as s; print(json.dumps({name: getattr(s, name) for name in ["
    "'SECURE_SSL_REDIRECT', 'SESSION_COOKIE_SECURE', 'CSRF_COOKIE_SECURE', 'SECURE_HSTS_SECONDS', "
    "'SECURE_HSTS_INCLUDE_SUBDOMAINS', 'SECURE_HSTS_PRELOAD', 'SECURE_PROXY_SSL_HEADER']}))"
)


def _clean_env(tmp_path, **env: str) -> dict[str, str]:
    """Only what a deployment's environment would hold: none of this process's settings."""
    secret = tmp_path / "secret_key"
    secret.write_text(secrets.token_urlsafe(50))
    base = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "FLEETADMIN_VAR_DIR": str(tmp_path / "var")}
    env = {**base, **env}
    for name in [name for name in env if name.endswith("_FILE")]:  # the page's secrets, made here
        env[name] = str(secret)
    return env


def _settings(tmp_path, **env: str) -> dict:
    done = subprocess.run([sys.executable, "-c", SHOW], cwd=REPO, env=_clean_env(tmp_path, **env),
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def _scaling_out_exports() -> dict[str, str]:
    page = REPO.joinpath("docs", "scaling-out.md").read_text()
    found = {}
    for line in page.splitlines():
        if line.startswith("export "):
            found.update(word.split("=", 1) for word in shlex.split(line, comments=True)[1:])
    return found


def test_the_scaling_out_page_sets_what_this_test_checks():
    exported = _scaling_out_exports()
    assert exported, "docs/scaling-out.md has no export lines"
    assert {name: PRODUCTION_ENV.get(name) for name in exported} == exported


def test_check_deploy_passes_with_the_documented_production_environment(tmp_path):
    done = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=REPO, env=_clean_env(tmp_path, **PRODUCTION_ENV), capture_output=True, text=True, timeout=120,
    )  # fmt: skip

    assert done.returncode == 0, done.stdout + done.stderr
    assert "System check identified no issues" in done.stdout


def test_the_embedded_default_fails_check_deploy_as_it_always_did(tmp_path):
    # The checks that test can pass are real: plain HTTP on loopback is what they warn about.
    done = subprocess.run([sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
                          cwd=REPO, env=_clean_env(tmp_path), capture_output=True, text=True, timeout=120)  # fmt: skip

    assert done.returncode != 0
    for warning in ("security.W004", "security.W008", "security.W012", "security.W016"):
        assert warning in done.stderr + done.stdout


def test_a_scaled_out_deployment_is_https_only_by_default(tmp_path):
    shown = _settings(tmp_path, DATABASE_URL="postgres://nobody@127.0.0.1:9/none", SECRET_KEY_FILE="made")

    assert shown == {
        "SECURE_SSL_REDIRECT": True,
        "SESSION_COOKIE_SECURE": True,
        "CSRF_COOKIE_SECURE": True,
        "SECURE_HSTS_SECONDS": 365 * 24 * 3600,
        "SECURE_HSTS_INCLUDE_SUBDOMAINS": True,
        "SECURE_HSTS_PRELOAD": False,  # a promise for the whole domain: the deployment opts in
        "SECURE_PROXY_SSL_HEADER": None,
    }


def test_the_embedded_default_serves_plain_http_as_before(tmp_path):
    shown = _settings(tmp_path)

    assert not any(shown[name] for name in shown)


def test_plain_http_is_said_once_and_each_setting_can_still_be_set(tmp_path):
    scaled_out = {"DATABASE_URL": "postgres://nobody@127.0.0.1:9/none", "SECRET_KEY_FILE": "made"}

    assert not any(_settings(tmp_path, **scaled_out, FLEETADMIN_HTTPS="false").values())
    shown = _settings(tmp_path, **scaled_out, SECURE_SSL_REDIRECT="false", SECURE_HSTS_SECONDS="3600",
                      SECURE_PROXY_SSL_HEADER="X-Forwarded-Proto")  # fmt: skip
    assert shown["SECURE_SSL_REDIRECT"] is False and shown["SESSION_COOKIE_SECURE"] is True
    assert shown["SECURE_HSTS_SECONDS"] == 3600
    assert shown["SECURE_PROXY_SSL_HEADER"] == ["HTTP_X_FORWARDED_PROTO", "https"]


@pytest.mark.parametrize("value", ["maybe", "1"])
def test_a_flag_that_is_not_true_or_false_stops_start_up(tmp_path, value):
    done = subprocess.run([sys.executable, "-c", SHOW], cwd=REPO, env=_clean_env(tmp_path, FLEETADMIN_HTTPS=value),
                          capture_output=True, text=True, timeout=60)  # fmt: skip

    assert done.returncode != 0
    assert "FLEETADMIN_HTTPS must be 'true' or 'false'" in done.stderr


# --- what a client sees -----------------------------------------------------------------------------


def test_plain_http_is_redirected_to_https_but_healthz_answers(client, settings):
    settings.SECURE_SSL_REDIRECT = True  # the conftest turns it off for the test client

    redirected = client.get("/login/?next=/", headers={"host": "127.0.0.1"})
    assert redirected.status_code == 301
    assert redirected["Location"] == "https://127.0.0.1/login/?next=/"
    assert client.get("/healthz").status_code == 200  # a load balancer's probe of the front's own port


def test_an_https_answer_carries_hsts_and_secure_cookies(client, settings):
    settings.SECURE_SSL_REDIRECT = True
    settings.SECURE_HSTS_SECONDS = 31_536_000
    settings.SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    settings.CSRF_COOKIE_SECURE = True

    page = client.get("/login/", secure=True)

    assert page.status_code == 200
    assert page["Strict-Transport-Security"] == "max-age=31536000; includeSubDomains"
    assert page.cookies["csrftoken"]["secure"] is True


@pytest.fixture
def front_behind_a_proxy(transactional_db, tmp_path):
    # HTTPS-only, as with DATABASE_URL set, on either database.
    env = child_env(tmp_path, FLEETADMIN_HTTPS="true", SECURE_PROXY_SSL_HEADER="HTTP_X_FORWARDED_PROTO")
    front, url = start_front(env, tmp_path)
    yield url
    front.stop()


def test_a_front_behind_a_tls_proxy_takes_https_from_the_proxys_header_alone(front_behind_a_proxy):
    url = front_behind_a_proxy
    with httpx.Client(timeout=30) as client:
        direct = client.get(f"{url}/login/")
        proxied = client.get(f"{url}/login/", headers={"X-Forwarded-Proto": "https"})
        probe = client.get(f"{url}/healthz")

    assert direct.status_code == 301 and direct.headers["location"].startswith("https://")
    assert proxied.status_code == 200
    assert "max-age=31536000" in proxied.headers["strict-transport-security"]
    csrf_cookie = next(h for h in proxied.headers.get_list("set-cookie") if h.startswith("csrftoken="))
    assert re.search(r";\s*Secure\b", csrf_cookie), csrf_cookie
    assert probe.status_code == 200
