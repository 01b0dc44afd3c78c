"""Every model change has its migration: a deployment migrates to exactly the models in the code."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command


@pytest.mark.django_db
def test_no_model_change_is_missing_its_migration():
    out = StringIO()
    try:
        call_command("makemigrations", "--check", "--dry-run", stdout=out, stderr=out)
    except SystemExit as exc:
        pytest.fail(f"makemigrations would write migrations (exit {exc.code}):\n{out.getvalue()}")
