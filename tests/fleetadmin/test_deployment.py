"""A deployment's pod prefix (fleetadmin/deployment.py): a fresh database gets one of its own, an
upgraded one with pods keeps the shared "fa" and the system check warns, FLEETADMIN_DEPLOYMENT wins."""

from __future__ import annotations

import re
from io import StringIO

import pytest
from django.core.checks import run_checks
from django.core.management import call_command
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from fleetadmin.deployment import check_pod_prefix, pod_prefix
from fleetadmin.models import Deployment
from pods.models import Pod, pod_name

GENERATED = re.compile(r"fa[a-z2-7]{6}")
BEFORE, AFTER = ("fleetadmin", "0002_worker_host"), ("fleetadmin", "0003_deployment")


@pytest.fixture
def from_the_database(settings):
    settings.DEPLOYMENT_PREFIX = ""  # FLEETADMIN_DEPLOYMENT unset


def _migrate(target: tuple[str, str]) -> None:
    MigrationExecutor(connection).migrate([target])


def _the_migration_runs() -> str:
    """The deployment's migration, run again on this database as it is now: its prefix."""
    _migrate(BEFORE)
    _migrate(AFTER)
    return Deployment.objects.get().pod_prefix


def _warnings(**kwargs) -> list[str]:
    return [message.id for message in run_checks(**kwargs) if message.id == "fleetadmin.W001"]


def test_a_fresh_database_gets_a_prefix_of_its_own(transactional_db, from_the_database, local_pool):
    Pod.objects.all().delete()
    first, second = _the_migration_runs(), _the_migration_runs()

    assert GENERATED.fullmatch(first) and GENERATED.fullmatch(second), (first, second)
    assert first != second  # two databases, two deployments
    assert pod_prefix() == second
    assert pod_name(local_pool, "x1") == f"{second}-local-x1"
    assert _warnings(databases=["default"]) == []


def test_an_upgraded_database_with_pods_keeps_fa_and_the_check_warns(transactional_db, from_the_database, local_pool):
    Pod.objects.create(pool=local_pool, name="fa-local-running", state=Pod.State.READY)

    assert _the_migration_runs() == "fa"  # its running pods are still its own
    assert pod_prefix() == "fa"
    assert _warnings(databases=["default"]) == ["fleetadmin.W001"]
    assert _warnings() == []  # checks that are not given databases do not read one


def test_renewing_gives_the_upgraded_database_a_prefix_of_its_own(db, from_the_database):
    Deployment.objects.update_or_create(pk=Deployment.ONLY, defaults={"pod_prefix": "fa"})
    out = StringIO()

    call_command("pod_prefix", "--renew", stdout=out)

    renewed = Deployment.objects.get().pod_prefix
    assert GENERATED.fullmatch(renewed) and out.getvalue().startswith(renewed)
    assert pod_prefix() == renewed
    assert _warnings(databases=["default"]) == []


def test_fleetadmin_deployment_set_explicitly_wins(db, settings, local_pool):
    Deployment.objects.update_or_create(pk=Deployment.ONLY, defaults={"pod_prefix": "fa"})
    settings.DEPLOYMENT_PREFIX = "blue"

    assert pod_prefix() == "blue"
    assert pod_name(local_pool, "x1") == "blue-local-x1"
    assert _warnings(databases=["default"]) == []  # the database's "fa" is not in force
    out = StringIO()
    call_command("pod_prefix", stdout=out)
    assert out.getvalue().strip() == "blue (from FLEETADMIN_DEPLOYMENT; the database keeps fa)"


def test_fleetadmin_deployment_set_to_fa_is_warned_about_without_a_database(settings):
    settings.DEPLOYMENT_PREFIX = "fa"

    assert [message.id for message in check_pod_prefix()] == ["fleetadmin.W001"]
    assert _warnings() == ["fleetadmin.W001"]


def test_the_check_reads_nothing_before_the_table_is_made(transactional_db, from_the_database):
    _migrate(BEFORE)
    try:
        assert _warnings(databases=["default"]) == []  # migrate runs its checks before it migrates
    finally:
        _migrate(AFTER)
