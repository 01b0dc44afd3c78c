"""manage.py bootstrap (run by make run and once per deploy): the admin's secrets are shown once,
when they are made, and kept in a file only its owner can read."""

from __future__ import annotations

import io
import stat

import pytest
from django.core.management import call_command


@pytest.fixture
def var_dir(settings, tmp_path):
    settings.VAR_DIR = tmp_path
    return tmp_path


def _bootstrap() -> str:
    out = io.StringIO()
    call_command("bootstrap", stdout=out)
    return out.getvalue()


def test_the_admin_secrets_are_printed_once_and_kept_private(db, var_dir):
    first, second = _bootstrap(), _bootstrap()

    credentials = var_dir / "admin-credentials.txt"
    password = next(line for line in credentials.read_text().splitlines() if line.startswith("password: "))
    assert password in first and password not in second
    assert "api token: " not in second and str(credentials) in second
    assert stat.S_IMODE(credentials.stat().st_mode) == 0o600
