"""manage.py apitoken: issues a token, prints it once, refuses bad input."""

from __future__ import annotations

import io

import pytest
from django.core.management import CommandError, call_command

from accounts.models import ApiToken, hash_token


def test_it_prints_a_token_that_authenticates_with_the_scopes_asked(client, ordinary_user):
    out = io.StringIO()

    call_command("apitoken", "bob", "--scopes", "read", "--name", "ci", stdout=out)

    token = out.getvalue().strip()
    row = ApiToken.objects.get(token_hash=hash_token(token))
    assert (row.user, row.name, row.scope_list()) == (ordinary_user, "ci", ["read"])
    headers = {"Authorization": f"Bearer {token}"}
    assert client.get("/v1/jobs", headers=headers).status_code == 200
    assert client.post("/v1/jobs", {}, headers=headers).status_code == 403


def test_it_refuses_an_unknown_user(db):
    with pytest.raises(CommandError, match="no user 'nobody'"):
        call_command("apitoken", "nobody", stdout=io.StringIO())

    assert ApiToken.objects.count() == 0


def test_it_refuses_an_unknown_scope(ordinary_user):
    with pytest.raises(CommandError, match="unknown scopes: write"):
        call_command("apitoken", "bob", "--scopes", "read,write", stdout=io.StringIO())

    assert ApiToken.objects.count() == 0
