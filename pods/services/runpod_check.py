"""One pod rented, reached and terminated on the real RunPod, every answer shown: what an operator
runs before trusting a key, a pool's image and its candidates with a fleet (``manage.py
runpod_check``; docs/runpod.md).

The steps: the catalogue; a create on the pool's cheapest candidate (walking on past one that
answers "no capacity"), on demand or, with ``spot``, interruptible at a low bid; a wait until RunPod
runs the pod with its port exposed (image pulls take minutes); the pod server's ``/healthz`` and
``/v1/models`` through RunPod's proxy with the pod's token; the terminate, always, whatever failed
before it (a Ctrl-C or SIGTERM included), confirmed by reading the pod back. Everything goes
through the provider (pods/providers/runpod.py) and its table (runpod_api.py): what RunPod says
is shown as the provider sorted it, its wording and ``extensions.code`` with it, and each retry
the provider made on the way (its log records).

The pod is named ``fleetadmin-check-…``, outside every deployment's prefix, so that no
deployment's reconcile takes it for one of its own and terminates it mid-check; it carries the
pool's ``AUTOSTOP_SECONDS`` as a booted pod does, so that a check killed with -9 leaves a pod that
stops itself.
"""

from __future__ import annotations

import logging
import secrets
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from decimal import Decimal

import httpx
from django.conf import settings

from fleetadmin.localhost import localhost_transport
from pods import planning
from pods.models import Pool
from pods.podclient import pod_headers
from pods.poolconfig import PoolConfigError, pool_offers
from pods.providers.base import AuthFailed, Balance, NoCapacity, Offer, PodSpec, ProviderError, Transient
from pods.providers.runpod import RunPodProvider

NAME_PREFIX = "fleetadmin-check-"
POD_ANSWER_BYTES = 64 * 1024  # what is read of each pod server answer (its JSON is a few hundred bytes)
POD_REQUEST_SECONDS = 10.0
SHOWN_CHARS = 300  # of each answer's body, printed
TERMINATE_TRIES = 3


@dataclass
class CheckReport:
    """What the check did: the pod it rented (if any), the rate RunPod charged, the seconds from
    the create's answer to the terminate's, and each step that failed."""

    failures: list[str] = field(default_factory=list)
    pod_id: str = ""
    cost_per_hr: Decimal = Decimal("0")
    billed_seconds: float = 0.0
    terminated: bool = False

    @property
    def spend(self) -> Decimal:
        return (self.cost_per_hr * Decimal(str(self.billed_seconds)) / 3600).quantize(Decimal("0.000001"))


class CheckFailed(Exception):
    """A step of the check that did not give what it should (the message says which and why)."""


class Interrupted(Exception):
    """SIGTERM during the check: handled as Ctrl-C is (the pod is terminated, the check fails)."""


def runpod_check(
    *,
    pool: Pool,
    spot: bool = False,
    bid: Decimal | None = None,
    deadline_seconds: float = 1200.0,
    say: Callable[[str], None] = print,
    provider: RunPodProvider | None = None,
) -> CheckReport:
    """Rent the cheapest pod of ``pool``, wait for it, ask its pod server, terminate it; each step
    told through ``say``. ``spot``: interruptible, at ``bid`` per GPU (default: the catalogue's
    minimum bid for the candidate's cloud, the lowest RunPod takes). ``deadline_seconds`` bounds
    everything before the terminate, which is always made."""
    report = CheckReport()
    provider = provider or RunPodProvider()
    deadline = time.monotonic() + deadline_seconds
    name = f"{NAME_PREFIX}{pool.key}-{secrets.token_hex(4)}"
    token = secrets.token_urlsafe(32)
    created_at = None
    with _retries_shown(say), _sigterm_interrupts():
        try:
            candidates = _candidates(pool, provider, spot=spot, bid=bid, say=say)
            created, offer = _create(pool, provider, candidates, name=name, token=token, report=report, say=say)
            created_at = time.monotonic()
            report.cost_per_hr = created.cost_per_hr or offer.cost_per_hr
            say(
                f"created  {created.provider_id} ({name}) on {_offer_text(offer)}: RunPod charges ${_usd(report.cost_per_hr)}/h"
            )
            base_url = _wait_running(provider, created.provider_id, deadline=deadline, say=say)
            _ask_pod_server(base_url, token=token, deadline=deadline, say=say)
        except (KeyboardInterrupt, Interrupted) as exc:
            report.failures.append("interrupted" + (f" ({exc})" if str(exc) else ""))
            say("interrupted: terminating what was rented")
        except CheckFailed as exc:
            report.failures.append(str(exc))
            say(f"FAILED   {exc}")
        except ProviderError as exc:
            report.failures.append(f"{type(exc).__name__}: {exc}")
            say(f"FAILED   {type(exc).__name__}: {exc}")
        finally:
            with _signals_deferred(say):
                _terminate_all(provider, name, report, say=say)
                if created_at is not None:
                    report.billed_seconds = time.monotonic() - created_at
    say(
        f"spend    ${report.spend} (${_usd(report.cost_per_hr)}/h × {report.billed_seconds:.1f} s, create to terminate)"
        if report.pod_id
        else "spend    $0 (no pod was rented)"
    )
    return report


# -- the steps ---------------------------------------------------------------------------------------


def _candidates(
    pool: Pool, provider: RunPodProvider, *, spot: bool, bid: Decimal | None, say: Callable[[str], None]
) -> list[Offer]:
    """The pool's candidates priced from RunPod's catalogue, cheapest first; with ``spot`` each
    made interruptible at ``bid`` (or at its cloud's minimum bid)."""
    if pool.provider != Pool.Provider.RUNPOD:
        raise CheckFailed(f"pool {pool.key!r} is a {pool.provider} pool, not a RunPod one")
    try:
        offers, _ = pool_offers(pool)
    except PoolConfigError as exc:
        raise CheckFailed(f"pool {pool.key!r}: its config is not usable: {exc}") from None
    offers = [replace(o, interruptible=spot, bid_margin=Decimal("0")) for o in offers]
    catalogue = provider.catalogue()
    say(f"catalogue {len(catalogue)} offers from RunPod")
    candidates = planning.priced(offers, catalogue)
    if spot and bid is not None:
        candidates = sorted((replace(o, cost_per_hr=bid) for o in candidates), key=lambda o: o.cost_per_hr)
    if not candidates:
        kind = "interruptible " if spot else ""
        raise CheckFailed(f"none of the pool's {len(offers)} candidates is in RunPod's catalogue as an {kind}offer")
    return candidates


def _create(
    pool: Pool,
    provider: RunPodProvider,
    candidates: list[Offer],
    *,
    name: str,
    token: str,
    report: CheckReport,
    say: Callable[[str], None],
):
    """A pod on the cheapest candidate that gives one; each refusal shown as RunPod worded it. No
    capacity and transient faults walk on; a refused key or balance ends the walk; a refusal the
    provider's table does not know walks on but fails the check (its wording is what to report)."""
    _, config = pool_offers(pool)
    for offer in candidates:
        spec = PodSpec(
            name=name,
            lanes=pool.lanes_per_pod,
            offer=offer,
            image=config.image,
            ports=config.ports,
            env={**config.env, "POD_TOKEN": token, "AUTOSTOP_SECONDS": str(pool.autostop_seconds)},
            page_timeout=settings.PAGE_TIMEOUT_SECONDS,
            options=config.pod_options(),
        )
        say(f"create   {_offer_text(offer)}")
        try:
            created = provider.create(spec)
            report.pod_id = created.provider_id  # at once: the terminate must find it whatever comes next
            return created, offer
        except (AuthFailed, Balance):
            raise
        except (NoCapacity, Transient) as exc:
            say(f"  answer {type(exc).__name__}: {exc}")
        except ProviderError as exc:
            say(f"  answer {type(exc).__name__}: {exc}")
            report.failures.append(f"create on {offer.key}: {type(exc).__name__}: {exc}")
    raise CheckFailed(f"no candidate of the {len(candidates)} gave a pod")


def _wait_running(provider: RunPodProvider, pod_id: str, *, deadline: float, say: Callable[[str], None]) -> str:
    """The pod's base URL once RunPod runs it with its port exposed; each change RunPod reports
    shown. A read RunPod could not answer is asked again (as a boot does); a stop ends the wait."""
    started, polls, last = time.monotonic(), 0, None
    while True:
        try:
            seen = provider.get(pod_id)
        except Transient as exc:
            seen, state = None, f"a read failed, asked again: {exc}"
        else:
            if seen is None:
                raise CheckFailed(f"RunPod no longer has pod {pod_id}")
            if seen.stopped:
                raise CheckFailed(f"RunPod stopped pod {pod_id} ({seen.stop_cause}) before it ran")
            if seen.running and seen.base_url:
                say(f"running  after {time.monotonic() - started:.1f} s at {seen.base_url}")
                return seen.base_url
            state = "created, not running yet (an image pull takes minutes)"
        if state != last:
            say(f"  pod    {state}")
            last = state
        polls += 1
        _sleep_until_next(polls, deadline=deadline, waiting_for=f"pod {pod_id} to run")


def _ask_pod_server(base_url: str, *, token: str, deadline: float, say: Callable[[str], None]) -> None:
    """``/healthz`` until the pod server says ok (its engine loads meanwhile), then ``/v1/models``;
    each answer shown, through RunPod's proxy with the pod's token."""
    polls, last = 0, None
    with httpx.Client(
        headers=pod_headers(token), transport=localhost_transport(), timeout=POD_REQUEST_SECONDS
    ) as client:
        while True:
            status, text = _get(client, f"{base_url}/healthz")
            if (status, text) != last:
                say(f"healthz  {status} {text}")
                last = (status, text)
            if status == 200:
                break
            if status == 503 and '"failed"' in text:
                raise CheckFailed(f"the pod server's engine failed: {text}")
            polls += 1
            _sleep_until_next(polls, deadline=deadline, waiting_for="the pod server's /healthz")
        status, text = _get(client, f"{base_url}/v1/models")
        say(f"models   {status} {text}")
        if status != 200:
            raise CheckFailed(f"the pod server's /v1/models answered {status}")


def _get(client: httpx.Client, url: str) -> tuple[int | str, str]:
    """One GET: its status and the start of its body (read up to POD_ANSWER_BYTES), or the fault."""
    try:
        with client.stream("GET", url) as response:
            body = b""
            for chunk in response.iter_bytes():
                body += chunk
                if len(body) >= POD_ANSWER_BYTES:
                    break
            return response.status_code, body[:SHOWN_CHARS].decode("utf-8", "replace")
    except httpx.HTTPError as exc:
        return "no answer", f"{type(exc).__name__}: {exc}"[:SHOWN_CHARS]


def _sleep_until_next(polls: int, *, deadline: float, waiting_for: str) -> None:
    """Wait before the next poll: POD_POLL_SECONDS, twice as long each ten polls up to
    POD_POLL_MAX_SECONDS (a pull of minutes is not asked about every second); CheckFailed past
    the deadline."""
    delay = min(settings.POD_POLL_MAX_SECONDS, settings.POD_POLL_SECONDS * 2 ** min(polls // 10, 16))
    if time.monotonic() + delay > deadline:
        raise CheckFailed(f"gave up waiting for {waiting_for}: the check's deadline passed")
    time.sleep(delay)


def _terminate_all(provider: RunPodProvider, name: str, report: CheckReport, *, say: Callable[[str], None]) -> None:
    """Terminate the pod the check rented, and any pod of its name a create made whose answer was
    lost; confirmed by reading it back. A terminate that fails is tried again, then reported."""
    pod_ids = [report.pod_id] if report.pod_id else []
    try:
        pod_ids += [p.provider_id for p in provider.list(prefix=name) if p.provider_id not in pod_ids]
    except ProviderError as exc:
        say(f"  list   {type(exc).__name__}: {exc} (pods of {name} a lost create answer made may be left)")
    for pod_id in pod_ids:
        for attempt in range(1, TERMINATE_TRIES + 1):
            try:
                provider.terminate(pod_id)
                seen = provider.get(pod_id)
            except ProviderError as exc:
                say(f"  terminate {pod_id}: {type(exc).__name__}: {exc} (try {attempt} of {TERMINATE_TRIES})")
                continue
            if seen is None or seen.gone:
                say(f"terminated {pod_id} (RunPod no longer runs it)")
                report.terminated = report.terminated or pod_id == report.pod_id
                break
            say(f"  terminate {pod_id}: RunPod still shows it (try {attempt} of {TERMINATE_TRIES})")
        else:
            report.failures.append(f"pod {pod_id} may still be billing: terminate it in RunPod's console")
            say(f"FAILED   pod {pod_id} may still be billing: terminate it in RunPod's console")


def _usd(value: Decimal) -> str:
    return format(value.normalize(), "f")


def _offer_text(offer: Offer) -> str:
    where = "/".join(part for part in (offer.cloud_type, offer.data_center) if part)
    price = f"bid ${_usd(offer.cost_per_hr)}/h" if offer.interruptible else f"${_usd(offer.cost_per_hr)}/h"
    return f"{offer.gpu_type} {where} ({'interruptible, ' if offer.interruptible else ''}{price})"


# -- what the check shows of the provider, and its signals ---------------------------------------------


@contextmanager
def _retries_shown(say: Callable[[str], None]) -> Iterator[None]:
    """The provider's own log records (each transient answer it retried, with RunPod's words) shown
    as the check's lines while it runs."""

    class Shown(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            say(f"  retry  {record.getMessage()}")

    handler, logger = Shown(level=logging.WARNING), logging.getLogger("pods.providers.runpod")
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@contextmanager
def _sigterm_interrupts() -> Iterator[None]:
    """SIGTERM ends the check as Ctrl-C does: through the terminate."""
    if not _main_thread():
        yield
        return

    def interrupt(signum, frame):
        raise Interrupted(signal.Signals(signum).name)

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextmanager
def _signals_deferred(say: Callable[[str], None]) -> Iterator[None]:
    """While the pod is terminated, Ctrl-C and SIGTERM wait: a second Ctrl-C must not leave it billing."""
    if not _main_thread():
        yield
        return

    def deferred(signum, frame):
        say(f"  {signal.Signals(signum).name} ignored until the pod is terminated")

    previous = {signum: signal.signal(signum, deferred) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
