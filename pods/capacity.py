"""Capacity verdicts and the price catalogue, shared by every booter on every host.

Both live in the database: a verdict written by a boot on one host is read by
every other boot before it calls the provider.
"""

from __future__ import annotations

import copy
import logging
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal

from django.conf import settings
from django.db import IntegrityError
from django.db.models import F, Q
from django.utils import timezone

from pods.models import CapacityVerdict, PriceCatalogue
from pods.providers import get_provider
from pods.providers.base import Offer, ProviderError

log = logging.getLogger(__name__)

PROBE_LOCK_SECONDS = 120  # a create call that takes longer than this is a dead boot
CATALOGUE_FETCH_LOCK_SECONDS = 30
# A person's "fresh" gets a list at most this old: any read token asking again and again must not
# turn into back-to-back calls on the provider's key that the boots share (review L4).
CATALOGUE_FRESH_SECONDS = 10


def candidate_block(key: str, *, seconds: float, reason: str) -> None:
    """Every boot skips the candidate for ``seconds`` (as after "no capacity"): e.g. its
    interruptible pod was just preempted, so its market is outbid now."""
    if seconds <= 0:
        return
    try:
        CapacityVerdict.objects.get_or_create(key=key)
    except IntegrityError:
        pass  # created by another booter at the same moment
    until = timezone.now() + timedelta(seconds=seconds)
    CapacityVerdict.objects.filter(key=key).update(blocked_until=until, open_until=None, open_slots=0,
                                                   reason=reason[:500])  # fmt: skip


def blocked_keys(keys: list[str]) -> set[str]:
    now = timezone.now()
    return set(CapacityVerdict.objects.filter(key__in=keys, blocked_until__gt=now).values_list("key", flat=True))


PROBE = "probe"  # this boot is the one trying the candidate now
OPEN = "open"  # a create on it succeeded lately: boots create on it side by side


def probe_acquire(key: str) -> str | None:
    """How this boot may create on the candidate: ``PROBE`` (it is the one boot trying it now),
    ``OPEN`` (a create on it succeeded within the verdict TTL, and this boot took one of its free
    create slots), or None (blocked, probed by another boot, or every slot is out)."""
    try:
        CapacityVerdict.objects.get_or_create(key=key)
    except IntegrityError:
        pass  # created by another booter at the same moment
    now = timezone.now()
    unblocked = CapacityVerdict.objects.filter(key=key).filter(
        Q(blocked_until__isnull=True) | Q(blocked_until__lte=now)
    )
    if unblocked.filter(open_until__gt=now).exists():
        took = unblocked.filter(open_until__gt=now, open_slots__gt=0).update(open_slots=F("open_slots") - 1)
        return OPEN if took == 1 else None
    # Not open either: a probe that ended with a pod between the read above and this write opened
    # it, and a second boot probing it now beside the one in its slot is one create too many
    # (bench/boot_storm.py: a candidate with room for one pod refused two boots).
    closed = Q(open_until__isnull=True) | Q(open_until__lte=now)
    taken = unblocked.filter(closed, Q(probing_until__isnull=True) | Q(probing_until__lt=now)).update(
        probing_until=now + timedelta(seconds=PROBE_LOCK_SECONDS)
    )
    return PROBE if taken == 1 else None


def probe_finish(
    key: str, *, how: str = PROBE, blocked_for: float = 0.0, created: bool = False, reason: str = ""
) -> None:
    """End a create on the candidate (``how`` it was allowed, from probe_acquire): block it for
    everybody, or open it after a success, or give its slot back after an error that says nothing
    of its capacity.

    An open candidate lets as many creates out at once as it has slots. The probe's success
    opens it with one; each create on it that succeeds gives its slot back and adds one, so the
    creates out on it double while it keeps giving pods (64 boots of one GPU type are created in
    7 rounds, not 64), and when its capacity runs out only the creates then out are refused:
    never every boot that happened to be walking (bench/boot_storm.py: 177 create calls for 32
    boots over 70 candidates when every walking boot created on it at once; the goal is 102).
    A slot whose step died is lost until the verdict lapses, as a probe lock is until it expires.
    """
    now = timezone.now()
    fields: dict = {"probing_until": None} if how == PROBE else {}
    if blocked_for > 0:
        fields.update(
            blocked_until=now + timedelta(seconds=blocked_for), open_until=None, open_slots=0, reason=reason[:500]
        )
    elif created:
        ttl = timedelta(seconds=settings.CAPACITY_VERDICT_TTL_SECONDS)
        slots = 1 if how == PROBE else F("open_slots") + 2
        fields.update(blocked_until=None, open_until=now + ttl, open_slots=slots, reason="")
    elif how == OPEN:
        fields.update(open_slots=F("open_slots") + 1)
    if fields:
        CapacityVerdict.objects.filter(key=key).update(**fields)


def verdicts_in_force(*, now: datetime) -> list[CapacityVerdict]:
    """The verdicts that block a candidate, or hold its probe, at ``now``: what the status shows."""
    return list(CapacityVerdict.objects.filter(Q(blocked_until__gt=now) | Q(probing_until__gt=now)))


# --- the price catalogue -----------------------------------------------------------------------


@dataclass(frozen=True)
class Catalogue:
    offers: list[Offer]
    fetched_at: object
    stale: bool
    error: str


def _to_json(offers: list[Offer]) -> list[dict]:
    return [
        {
            "gpu_type": o.gpu_type,
            "cloud_type": o.cloud_type,
            "data_center": o.data_center,
            "cost_per_hr": str(o.cost_per_hr),
            "min_bid": None if o.min_bid is None else str(o.min_bid),
        }
        for o in offers
    ]


def _from_json(rows: list[dict]) -> list[Offer]:
    # Fresh objects every call: a caller that changes its copy changes nobody else's.
    return [
        Offer(
            gpu_type=r["gpu_type"],
            cloud_type=r["cloud_type"],
            data_center=r["data_center"],
            cost_per_hr=Decimal(r["cost_per_hr"]),
            min_bid=Decimal(r["min_bid"]) if r.get("min_bid") is not None else None,  # (lists stored before bids)
        )  # fmt: skip
        for r in copy.deepcopy(rows)
    ]


def catalogue_get(provider_name: str, *, fresh: bool = False, wait: bool = True) -> Catalogue | None:
    """The provider's offers with prices, fetched at most once per ``CATALOGUE_TTL_SECONDS``.

    One caller fetches while the others read the last good list; a failed fetch
    keeps the last good list. ``fresh`` skips the age check (a person asking).
    While another caller fetches the very first list, a caller that must not
    wait (a boot step) gets None.
    """
    try:
        row, _ = PriceCatalogue.objects.get_or_create(provider=provider_name)
    except IntegrityError:
        row = PriceCatalogue.objects.get(provider=provider_name)
    now = timezone.now()
    ttl = timedelta(
        seconds=min(settings.CATALOGUE_TTL_SECONDS, CATALOGUE_FRESH_SECONDS)
        if fresh
        else settings.CATALOGUE_TTL_SECONDS
    )
    if row.fetched_at and now - row.fetched_at < ttl:
        return Catalogue(_from_json(row.offers), row.fetched_at, False, row.last_error)
    claim = PriceCatalogue.objects.filter(pk=row.pk).filter(Q(fetching_until__isnull=True) | Q(fetching_until__lt=now))
    # Another caller may have fetched since we read the row: then its list is ours.
    claim = claim.filter(Q(fetched_at__isnull=True) | Q(fetched_at__lt=now - ttl))
    if not claim.update(fetching_until=now + timedelta(seconds=CATALOGUE_FETCH_LOCK_SECONDS)):
        row.refresh_from_db()
        if row.fetched_at and timezone.now() - row.fetched_at < ttl:
            return Catalogue(_from_json(row.offers), row.fetched_at, False, row.last_error)
        if row.fetched_at is None and not wait:
            return None
        return _wait_for_fetch(row)
    log.info("fetching the %s price catalogue%s", provider_name, " (asked fresh)" if fresh else "")
    try:
        offers = get_provider(provider_name).catalogue()
    except ProviderError as exc:
        log.warning("%s catalogue fetch failed: %s; keeping the last good one", provider_name, exc)
        PriceCatalogue.objects.filter(pk=row.pk).update(fetching_until=None, last_error=str(exc)[:2000])
        if row.fetched_at is None:
            raise
        return Catalogue(_from_json(row.offers), row.fetched_at, True, str(exc))
    fetched_at = timezone.now()
    PriceCatalogue.objects.filter(pk=row.pk).update(
        offers=_to_json(offers), fetched_at=fetched_at, fetching_until=None, last_error="", fetches=row.fetches + 1
    )
    return Catalogue(_from_json(_to_json(offers)), fetched_at, False, "")


def _wait_for_fetch(row: PriceCatalogue) -> Catalogue:
    """Another caller is fetching: use the last good list, or wait for the first one."""
    if row.fetched_at is not None:
        return Catalogue(_from_json(row.offers), row.fetched_at, True, row.last_error)
    deadline = time.monotonic() + CATALOGUE_FETCH_LOCK_SECONDS
    while time.monotonic() < deadline:
        time.sleep(0.1)
        row.refresh_from_db()
        if row.fetched_at is not None:
            return Catalogue(_from_json(row.offers), row.fetched_at, False, row.last_error)
        if row.fetching_until is None:
            return catalogue_get(row.provider)
    raise ProviderError(f"the {row.provider} catalogue is not available yet")


def catalogue_cached(provider_name: str) -> Catalogue | None:
    """The stored catalogue as it is, without fetching (for the front)."""
    row = PriceCatalogue.objects.filter(provider=provider_name).first()
    if row is None or row.fetched_at is None:
        return None
    age = (timezone.now() - row.fetched_at).total_seconds()
    return Catalogue(_from_json(row.offers), row.fetched_at, age >= settings.CATALOGUE_TTL_SECONDS, row.last_error)
