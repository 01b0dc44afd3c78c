"""Password logins are throttled (django-axes): after LOGIN_FAILURE_LIMIT failures for one user name
from one address, that pair is refused even with the right password, until the lock lapses. API
tokens are not passwords and are never counted. On whichever database the suite runs."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from datetime import timedelta

import httpx
import pytest
from axes.models import AccessAttempt
from django.test import Client

from tests.helpers import auth
from tools.processes import REPO, child_env, start_front

ATTACKER = "198.51.100.7"
ELSEWHERE = "203.0.113.9"
LOGINS = ["/login/", "/admin/login/"]


def _log_in(address: str, login: str, username: str, password: str) -> int:
    """A fresh browser at ``address`` posts the login form; the answer's status (302: logged in)."""
    client = Client(REMOTE_ADDR=address)
    return client.post(login, {"username": username, "password": password, "next": "/"}).status_code


@pytest.fixture
def limit(settings):
    settings.AXES_FAILURE_LIMIT = 3
    return 3


@pytest.mark.parametrize("login", LOGINS)
def test_the_attempt_after_the_limit_is_refused_even_with_the_right_password(admin_user, limit, login):
    assert _log_in(ATTACKER, login, "alice", "alice-pass-1") == 302  # the right password works

    failures = [_log_in(ATTACKER, login, "alice", f"guess-{n}") for n in range(limit)]
    refused = _log_in(ATTACKER, login, "alice", "alice-pass-1")

    assert failures[:-1] == [200] * (limit - 1)  # the form again, with its error
    assert failures[-1] == 429  # the limit-th failure locks
    assert refused == 429


def test_the_lock_page_says_what_happened(ordinary_user, limit):
    for n in range(limit):
        _log_in(ATTACKER, "/login/", "bob", f"guess-{n}")

    page = Client(REMOTE_ADDR=ATTACKER).post("/login/", {"username": "bob", "password": "bob-pass-1"})

    assert page.status_code == 429
    text = page.content.decode()
    assert "Too many failed logins" in text and "bob" in text and f"after {limit} failed attempts" in text


def test_a_lock_holds_one_name_from_one_address_only(ordinary_user, admin_user, limit):
    for n in range(limit):
        _log_in(ATTACKER, "/login/", "bob", f"guess-{n}")

    assert _log_in(ATTACKER, "/login/", "bob", "bob-pass-1") == 429
    assert _log_in(ELSEWHERE, "/login/", "bob", "bob-pass-1") == 302  # nobody locks bob out from afar
    assert _log_in(ATTACKER, "/login/", "alice", "alice-pass-1") == 302


def test_the_lock_lapses_after_its_time(ordinary_user, limit, settings):
    for n in range(limit):
        _log_in(ATTACKER, "/login/", "bob", f"guess-{n}")
    assert _log_in(ATTACKER, "/login/", "bob", "bob-pass-1") == 429

    # The failures as if they were made longer ago than the lock lasts (no test waits on the clock).
    for attempt in AccessAttempt.objects.all():
        attempt.attempt_time -= settings.AXES_COOLOFF_TIME + timedelta(seconds=1)
        attempt.save()

    assert _log_in(ATTACKER, "/login/", "bob", "bob-pass-1") == 302


def test_a_login_resets_the_count(ordinary_user, limit):
    for n in range(limit - 1):
        _log_in(ATTACKER, "/login/", "bob", f"guess-{n}")
    assert _log_in(ATTACKER, "/login/", "bob", "bob-pass-1") == 302

    assert _log_in(ATTACKER, "/login/", "bob", "guess-again") == 200  # counting starts afresh


def test_api_tokens_are_not_throttled(ordinary_user, read_token, limit):
    for n in range(limit):
        _log_in(ATTACKER, "/login/", "bob", f"guess-{n}")
    assert _log_in(ATTACKER, "/login/", "bob", "bob-pass-1") == 429

    for _ in range(limit + 1):  # a wrong token is a 401, and counts toward nothing
        assert Client(REMOTE_ADDR=ATTACKER).get("/v1/jobs", headers=auth("wrong")).status_code == 401
    assert Client(REMOTE_ADDR=ATTACKER).get("/v1/jobs", headers=auth(read_token)).status_code == 200


def test_the_limit_and_the_lock_come_from_the_environment(tmp_path):
    code = "import json, fleetadmin.settings as s; print(json.dumps([s.AXES_FAILURE_LIMIT, s.AXES_COOLOFF_TIME.total_seconds()]))"
    env = {"PATH": "/usr/bin:/bin", "FLEETADMIN_VAR_DIR": str(tmp_path), "LOGIN_FAILURE_LIMIT": "7",
           "LOGIN_LOCKOUT_SECONDS": "60"}  # fmt: skip
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)

    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == [7, 60.0]


# --- behind a proxy ---------------------------------------------------------------------------------


def _log_in_through(url: str, forwarded_for: str, username: str, password: str) -> int:
    """A browser whose address the proxy puts in X-Forwarded-For logs in through a real front."""
    with httpx.Client(base_url=url, headers={"X-Forwarded-For": forwarded_for}, timeout=30) as browser:
        form = browser.get("/login/")
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form.text).group(1)
        data = {"csrfmiddlewaretoken": token, "username": username, "password": password, "next": "/"}
        return browser.post("/login/", data=data).status_code


def test_behind_a_proxy_the_front_counts_each_client_by_its_own_address(transactional_db, ordinary_user, tmp_path):
    # The front behind its proxy (docs/scaling-out.md): daphne's --proxy-headers makes the proxy's
    # X-Forwarded-For the client's address. Without it, every client would be the proxy's 127.0.0.1.
    env = child_env(tmp_path, LOGIN_FAILURE_LIMIT="2")
    front, url = start_front(env, tmp_path, options=("--proxy-headers",))
    try:
        failures = [_log_in_through(url, ATTACKER, "bob", f"guess-{n}") for n in range(2)]
        locked = _log_in_through(url, ATTACKER, "bob", "bob-pass-1")
        elsewhere = _log_in_through(url, ELSEWHERE, "bob", "bob-pass-1")
    finally:
        front.stop()

    assert failures == [200, 429]
    assert locked == 429
    assert elsewhere == 302
    assert set(AccessAttempt.objects.values_list("ip_address", flat=True)) == {ATTACKER}
