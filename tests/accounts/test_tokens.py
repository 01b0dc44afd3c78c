"""accounts.ApiToken: only a hash is kept, and what each scope allows."""

from __future__ import annotations

import hashlib

import pytest
from django.forms.models import model_to_dict

from accounts.models import ApiToken, hash_token


def test_issue_stores_only_the_hash_of_the_token(ordinary_user):
    row, token = ApiToken.issue(user=ordinary_user, name="laptop", scopes=["submit"])

    row.refresh_from_db()
    assert token.startswith("fa_") and len(token) > 40
    assert row.token_hash == hashlib.sha256(token.encode()).hexdigest()
    assert all(token not in str(value) for value in model_to_dict(row).values())
    assert ApiToken.objects.filter(token_hash=hash_token(token)).get() == row


def test_each_issue_gives_a_different_token(ordinary_user):
    _, first = ApiToken.issue(user=ordinary_user, name="a", scopes=["read"])
    _, second = ApiToken.issue(user=ordinary_user, name="b", scopes=["read"])

    assert first != second


@pytest.mark.parametrize(
    ("granted", "allowed"),
    [
        (["admin"], {"read", "submit", "admin"}),
        (["submit"], {"read", "submit"}),
        (["read"], {"read"}),
        (["read", "submit"], {"read", "submit"}),
        ([], set()),
    ],
)
def test_scopes_imply_the_lesser_ones(ordinary_user, granted, allowed):
    row, _ = ApiToken.issue(user=ordinary_user, name="t", scopes=granted)

    assert {scope for scope in ("read", "submit", "admin") if row.allows(scope)} == allowed


def test_an_unknown_scope_is_refused_and_no_token_is_made(ordinary_user):
    with pytest.raises(ValueError, match="unknown scopes: everything"):
        ApiToken.issue(user=ordinary_user, name="t", scopes=["read", "everything"])

    assert ApiToken.objects.count() == 0


def test_a_scope_the_token_does_not_name_is_not_allowed_by_its_spelling(ordinary_user):
    row, _ = ApiToken.issue(user=ordinary_user, name="t", scopes=["read"])

    assert not row.allows("Read")
    assert not row.allows("")


def test_using_a_token_records_when_it_was_last_used(client, ordinary_user):
    row, token = ApiToken.issue(user=ordinary_user, name="t", scopes=["read"])
    assert row.last_used_at is None

    response = client.get("/v1/jobs", headers={"Authorization": f"Bearer {token}"})

    assert response.status_code == 200
    row.refresh_from_db()
    assert row.last_used_at is not None


def test_last_used_is_written_at_most_once_a_minute_per_token(client, ordinary_user):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext
    from django.utils import timezone

    from fleetadmin.api import LAST_USED_RESOLUTION_SECONDS

    row, token = ApiToken.issue(user=ordinary_user, name="t", scopes=["read"])
    headers = {"Authorization": f"Bearer {token}"}

    def stamp_after_a_request():
        assert client.get("/v1/jobs", headers=headers).status_code == 200
        row.refresh_from_db()
        return row.last_used_at

    first = stamp_after_a_request()
    assert first is not None
    assert stamp_after_a_request() == first  # a second later: not written again
    with CaptureQueriesContext(connection) as seen:
        client.get("/v1/jobs", headers=headers)
    assert seen.captured_queries and not [q for q in seen.captured_queries if q["sql"].startswith("UPDATE")]

    a_minute_ago = timezone.now() - timezone.timedelta(seconds=LAST_USED_RESOLUTION_SECONDS + 1)
    ApiToken.objects.filter(pk=row.pk).update(last_used_at=a_minute_ago)
    assert stamp_after_a_request() > a_minute_ago  # older than a minute: written again


def test_the_hash_of_a_token_does_not_authenticate(client, ordinary_user):
    row, _ = ApiToken.issue(user=ordinary_user, name="t", scopes=["admin"])

    response = client.get("/v1/jobs", headers={"Authorization": f"Bearer {row.token_hash}"})

    assert response.status_code == 401


def test_an_admin_token_of_a_user_who_is_not_staff_is_not_admin(client, admin_user, local_pool):
    # Review L3: the admin scope belongs to staff; taking staff away takes the token's admin away.
    _, token = ApiToken.issue(user=admin_user, name="ops", scopes=["admin"])
    headers = {"Authorization": f"Bearer {token}"}
    release = {"path": "/v1/runpod/release", "data": '{"pod_id": 999}', "content_type": "application/json"}
    assert client.post(**release, headers=headers).status_code == 404  # admin: on to the (unknown) pod

    admin_user.is_staff = admin_user.is_superuser = False
    admin_user.save()

    refused = client.post(**release, headers=headers)
    assert refused.status_code == 403 and refused.json() == {"error": "this needs the 'admin' scope"}
    assert client.get("/v1/jobs", headers=headers).status_code == 200  # still read and submit


def test_a_token_cannot_be_handed_to_another_user_in_the_admin(client, admin_user, ordinary_user):
    row, _ = ApiToken.issue(user=ordinary_user, name="laptop", scopes=["submit"])
    client.force_login(admin_user)

    page = client.get(f"/admin/accounts/apitoken/{row.pk}/change/").content.decode()

    assert 'name="user"' not in page
