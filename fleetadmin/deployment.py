"""This deployment's pod prefix: the first part of every pod name, by which reconcile tells this
deployment's pods from those of another deployment on the same provider key (it terminates pods of
its prefix that its database does not know).

It is generated once, when the database is made, and kept there: every host of a scaled-out
deployment shares the database, so they all name and recognise pods alike (a file under one host's
var/ would make each host a deployment of its own, ending the others' pods as strangers).
``FLEETADMIN_DEPLOYMENT``, when set, wins over it.

A database that already had pods when the prefix came (an upgrade) keeps the prefix every
deployment used to share, "fa", so its running pods are still its own; the system check
``fleetadmin.W001`` warns about it until the deployment picks one of its own.
"""

from __future__ import annotations

import functools
import logging
import secrets

from django.apps import apps
from django.conf import settings
from django.core import checks
from django.db import connections

log = logging.getLogger(__name__)

LEGACY_PREFIX = "fa"
# RFC 4648's base32 letters, in lower case: 6 of them are 30 bits, and no "-", so no generated
# prefix plus "-" starts another's name, nor the legacy "fa-" one of theirs.
_ALPHABET = "abcdefghijklmnopqrstuvwxyz234567"


def new_prefix() -> str:
    """A fresh prefix: "fa" and 6 random letters and digits ("fa3kq7zx"); pod names stay short."""
    return LEGACY_PREFIX + "".join(secrets.choice(_ALPHABET) for _ in range(6))


def pod_prefix() -> str:
    """The prefix in force: ``FLEETADMIN_DEPLOYMENT`` when set, else the one the database keeps."""
    return settings.DEPLOYMENT_PREFIX or stored_prefix()


@functools.cache
def stored_prefix() -> str:
    """The database's prefix, read once per process (it never changes while hosts run).

    The migration that made the table wrote it; a database without the row (tests flush tables)
    gets a fresh one here, the same for every process that asks (one row, pk 1)."""
    # Looked up, not imported: pods.models imports this module while the app registry loads the models.
    Deployment = apps.get_model("fleetadmin", "Deployment")

    row, _ = Deployment.objects.get_or_create(pk=Deployment.ONLY, defaults={"pod_prefix": new_prefix()})
    if row.pod_prefix == LEGACY_PREFIX and not settings.DEPLOYMENT_PREFIX:
        log.warning("%s", _legacy_warning())  # once per process
    return row.pod_prefix


def forget() -> None:
    """Read the database's prefix again on next use (tests; ``manage.py pod_prefix --renew``)."""
    stored_prefix.cache_clear()


def renew_prefix() -> str:
    """Give the database a fresh prefix. Hosts that run go on with the one they read until they
    restart; the pods the database has stay recognised whatever their prefix (reconcile)."""
    # Looked up, not imported: pods.models imports this module while the app registry loads the models.
    Deployment = apps.get_model("fleetadmin", "Deployment")

    prefix = new_prefix()
    Deployment.objects.update_or_create(pk=Deployment.ONLY, defaults={"pod_prefix": prefix})
    forget()
    return prefix


def check_pod_prefix(app_configs=None, databases=None, **kwargs) -> list[checks.CheckMessage]:
    """fleetadmin.W001: the prefix in force is the one every deployment used to share.

    The database is read only when the check is given databases (``migrate``, ``check
    --database default``); FLEETADMIN_DEPLOYMENT set to it is seen by every check."""
    prefix = settings.DEPLOYMENT_PREFIX
    if not prefix and databases and "default" in databases:
        prefix = _stored_without_creating("default")
    return [_legacy_warning()] if prefix == LEGACY_PREFIX else []


def _legacy_warning() -> checks.Warning:
    return checks.Warning(
        f'pods are named with the prefix "{LEGACY_PREFIX}", which every deployment used to share: '
        "another deployment on the same RunPod key that uses it too ends this one's pods as strangers "
        "(and this one ends theirs)",
        hint="set FLEETADMIN_DEPLOYMENT to a name no other deployment on the key uses, or run "
        "`manage.py pod_prefix --renew` and restart every host; pods the database has keep being "
        "recognised whatever their prefix",
        id="fleetadmin.W001",
    )


def _stored_without_creating(alias: str) -> str:
    # Looked up, not imported: pods.models imports this module while the app registry loads the models.
    Deployment = apps.get_model("fleetadmin", "Deployment")

    connection = connections[alias]
    if Deployment._meta.db_table not in connection.introspection.table_names():
        return ""  # not migrated yet: migrate runs its checks before it migrates
    return Deployment.objects.using(alias).filter(pk=Deployment.ONLY).values_list("pod_prefix", flat=True).first() or ""
