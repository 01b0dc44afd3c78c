"""Shared slots given in turn by owner (fleetadmin/fairshare.py), the database's side: each owner's
first waiting rows, when each was last served, and the turns taken (``OwnerTurn``)."""

from __future__ import annotations

from django.db.models import Min, QuerySet
from django.utils import timezone

from fleetadmin import fairshare
from ocrjobs.models import OwnerTurn


def each_owners_first(rows: QuerySet, *, owner: str, first: str, fields: tuple[str, ...], count: int) -> list[tuple]:
    """``fields`` of each owner's first ``count`` rows by ``first``, owners in the order of their
    first (fairshare.OWNERS_CONSIDERED of them at most): rows bounded however many one owner has."""
    owners = rows.order_by().values(owner).annotate(oldest=Min(first)).order_by("oldest")
    found: list[tuple] = []
    for owner_id in owners.values_list(owner, flat=True)[: fairshare.OWNERS_CONSIDERED]:
        found += rows.filter(**{owner: owner_id}).order_by(first, "pk").values_list(*fields)[:count]
    return found


def served(kind: str, owners) -> dict:
    """{owner id: when last given a slot of ``kind``, as a timestamp} (never: absent)."""
    ids = {owner or 0 for owner in owners}
    rows = OwnerTurn.objects.filter(kind=kind, owner_id__in=ids).values_list("owner_id", "served_at")
    return {owner or None: at.timestamp() for owner, at in rows}


def turns_taken(kind: str, owners) -> None:
    """The owners were just given a slot of ``kind``: their turn goes to the back."""
    now = timezone.now()
    rows = [OwnerTurn(kind=kind, owner_id=owner or 0, served_at=now) for owner in set(owners)]
    if rows:
        OwnerTurn.objects.bulk_create(rows, update_conflicts=True, unique_fields=["kind", "owner_id"],
                                      update_fields=["served_at"])  # fmt: skip
