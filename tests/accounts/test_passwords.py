"""Django's standard password validators hold wherever a password is set through Django's forms
and commands (the admin's user pages, the password change, ``changepassword``)."""

from __future__ import annotations

import pytest
from django.contrib.auth.forms import SetPasswordForm
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError


@pytest.mark.parametrize(
    ("password", "reason"),
    [
        ("password1", "too common"),
        ("83920174615", "entirely numeric"),
        ("bob-the-builder", "too similar to the username"),
        ("Xq7!b", "too short"),
    ],
)
def test_a_weak_password_is_refused_with_its_reason(ordinary_user, password, reason):
    ordinary_user.username = "bob-the-builder"
    form = SetPasswordForm(ordinary_user, {"new_password1": password, "new_password2": password})

    assert not form.is_valid()
    assert reason in " ".join(form.errors["new_password2"])


def test_a_strong_password_is_taken(ordinary_user):
    form = SetPasswordForm(
        ordinary_user, {"new_password1": "tarn-quiver-77-lamp", "new_password2": "tarn-quiver-77-lamp"}
    )

    assert form.is_valid(), form.errors
    form.save()
    ordinary_user.refresh_from_db()
    assert ordinary_user.check_password("tarn-quiver-77-lamp")


def test_the_validators_are_the_standard_four():
    with pytest.raises(ValidationError) as refused:
        validate_password("12345678")
    assert {error.code for error in refused.value.error_list} == {"password_too_common", "password_entirely_numeric"}
