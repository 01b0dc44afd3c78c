"""RunPod pods: create, read, terminate and the price list, as RunPod really answers.

Every call blocks; callers run them in workers or a thread, never on an event loop. Calls go
through our own GraphQL call (pods/providers/runpod_api.py), which keeps RunPod's
``extensions.code`` and ``Retry-After`` that the SDK drops; the query texts are the SDK's own
(``runpod.api.queries``) or in its shape (``create_query``). ``RUNPOD_API_BASE_URL`` is read on
each call, as the SDK reads it, so the simulator (``manage.py runpodsim``) needs no patching.

What this module adds:
- values are checked before they are pasted into GraphQL text: a ``"`` in an env value would
  break or rewrite the query;
- failures are sorted (runpod_api.classify_error) and transient ones retried with jittered
  back-off, ``Retry-After`` honoured, within a total deadline;
- a stop is read from ``lastStatusChange`` (``stop_cause``): outbid, balance, RunPod's own, ours;
- the interruptible create falls back to RunPod's REST create once GraphQL no longer knows it;
- a pod's base URL comes from ``RUNPOD_POD_URL_TEMPLATE``.

Length: every call and the checks that guard it stay together: one place to read what reaches RunPod.

Settings (read from the environment in fleetadmin/settings.py): ``RUNPOD_API_KEY``
(or ``RUNPOD_API_KEY_FILE``), ``RUNPOD_POD_URL_TEMPLATE`` (the simulator prints the
one to use, ``http://{pod_id}-{port}.proxy.localhost:PORT``), ``RUNPOD_RETRY_DELAYS`` and
``RUNPOD_CALL_SECONDS``.
"""

from __future__ import annotations

import logging
import random
import re
import time
import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from typing import Any, TypeVar

import pods.providers.sdk  # noqa: F401  (first: the SDK without its CPU probe subprocess)

# isort: split
from django.conf import settings
from runpod.api.mutations import pods as pod_mutations
from runpod.api.queries import pods as pod_queries

from pods.providers import runpod_api
from pods.providers.base import (
    NoCapacity,
    Offer,
    PodSpec,
    ProviderError,
    ProviderPod,
    StopCause,
    Transient,
    UnknownOffer,
)

log = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_PORTS = "8000/http"
DEFAULT_POD_PORT = 8000
PROXY_PAGE_SECONDS = 90.0  # RunPod's HTTP proxy cuts a request at 100 s
CLOUD_TYPES = ("SECURE", "COMMUNITY", "ALL")

# One query for the whole price list: the SDK's get_gpus() has no prices and its
# get_gpu() costs one call per GPU type. Spot prices differ by cloud: each its own lowest bid.
CATALOGUE_QUERY = """
query GpuTypes {
  gpuTypes {
    id
    displayName
    memoryInGb
    secureCloud
    communityCloud
    securePrice
    communityPrice
    secureSpotPrice
    communitySpotPrice
    secureLowest: lowestPrice(input: {gpuCount: 1, secureCloud: true}) {
      minimumBidPrice
      uninterruptablePrice
    }
    communityLowest: lowestPrice(input: {gpuCount: 1, secureCloud: false}) {
      minimumBidPrice
      uninterruptablePrice
    }
  }
}
"""

# What a create selects: the rate RunPod charges (costPerHr) is read back into the pod's.
# machine { dataCenterId }: where RunPod placed the pod (a candidate may name no data centre).
CREATED_FIELDS = "id imageName machineId costPerHr machine { dataCenterId }"
MAX_BID_PER_GPU = Decimal("1000")
DEFAULT_CONTAINER_DISK_GB = 10  # the SDK's own default for on-demand pods, for spot pods too


class UnsafeValue(ProviderError, ValueError):
    """A value the SDK would paste unescaped into its GraphQL text; refused before any call."""


# -- checking values before the SDK sees them ---------------------------------------------------------

_ENV_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_PORTS = re.compile(r"\d{1,5}/(?:http|tcp)(?:,\d{1,5}/(?:http|tcp))*")
_DATA_CENTER = re.compile(r"[A-Za-z0-9][A-Za-z0-9-]*")
_IMAGE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/:@+-]*")
_POD_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")
_MOUNT_PATH = re.compile(r"/[A-Za-z0-9._/-]*")
_VOLUME_ID = re.compile(r"[A-Za-z0-9]+")
_REGISTRY_AUTH = re.compile(r"[A-Za-z0-9_-]+")
_CUDA = re.compile(r"\d{1,2}\.\d{1,2}")
# Control, format, surrogate, private-use, unassigned, and line/paragraph separators.
_REFUSED_CATEGORIES = {"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"}


def check_text(what: str, value: object, pattern: re.Pattern[str] | None = None) -> str:
    """Return ``value`` if it can go into the SDK's GraphQL unescaped, else raise UnsafeValue.

    The message names the offending character, never the value, which may be a secret.
    """
    if not isinstance(value, str):
        raise UnsafeValue(f"{what} must be a string, not {type(value).__name__}")
    if not value:
        raise UnsafeValue(f"{what} must not be empty")
    for position, char in enumerate(value):
        if char in '"\\' or unicodedata.category(char) in _REFUSED_CATEGORIES:
            raise UnsafeValue(f"{what} contains {char!r} at position {position}, which RunPod's SDK cannot send safely")
    if pattern is not None and not pattern.fullmatch(value):
        raise UnsafeValue(f"{what} is not valid here (it must match {pattern.pattern})")
    return value


def check_pod_id(provider_id: str) -> str:
    return check_text("pod id", provider_id, _POD_ID)


def create_arguments(spec: PodSpec) -> dict[str, Any]:
    """Every value a create sends, each string checked (``create_query`` pastes them into GraphQL)."""
    cloud_type = spec.offer.cloud_type or "ALL"
    if cloud_type not in CLOUD_TYPES:
        raise UnknownOffer(f"cloud type {cloud_type!r} is not one of {', '.join(CLOUD_TYPES)}")
    ports = (spec.ports or DEFAULT_PORTS).replace(" ", "")  # the SDK drops spaces itself
    # The pod answers a page it cannot finish before RunPod's proxy cuts the request (100 s,
    # Cloudflare 524): then its error is the page's time limit, not a gateway page.
    page_timeout = min(spec.page_timeout, PROXY_PAGE_SECONDS)
    env = {"LANES": str(spec.lanes), "PAGE_TIMEOUT": f"{page_timeout:g}", **spec.env}
    for key, value in env.items():
        check_text("env name", key, _ENV_KEY)
        if value != "":
            check_text(f"env value of {key}", value)
    options = spec.options
    disk = _whole("container disk", options.container_disk_gb)
    return {
        "name": check_text("pod name", spec.name),
        "image_name": check_text("image", spec.image, _IMAGE),
        "gpu_type_id": check_text("GPU type", spec.offer.gpu_type),
        "cloud_type": cloud_type,
        "data_center_id": check_text("data centre", spec.offer.data_center, _DATA_CENTER)
        if spec.offer.data_center
        else None,
        "gpu_count": 1,
        "ports": check_text("ports", ports, _PORTS),
        "env": env,
        # Always sent: the SDK's 10 GB default applies to its on-demand create only, and the spot
        # mutation without it gets RunPod's own (review row 10).
        "container_disk_in_gb": DEFAULT_CONTAINER_DISK_GB if disk is None else disk,
        "volume_in_gb": _whole("volume size", options.volume_gb),
        "volume_mount_path": check_text("volume mount path", options.volume_mount_path, _MOUNT_PATH),
        "network_volume_id": check_text("network volume id", options.network_volume_id, _VOLUME_ID)
        if options.network_volume_id
        else None,
        "registry_auth_id": check_text("registry auth id", options.registry_auth_id, _REGISTRY_AUTH)
        if options.registry_auth_id
        else None,
        "allowed_cuda_versions": [check_text("CUDA version", v, _CUDA) for v in options.allowed_cuda_versions] or None,
        "docker_args": check_text("docker args", options.docker_args) if options.docker_args else "",
        # The SDK turns both on unless told: a pod then runs sshd and holds a public IP that
        # nothing here uses (pages go through RunPod's proxy, or the IP when the URL template
        # names it). Off unless the pool asks (issue 23 item 8).
        "start_ssh": options.ssh,
        "support_public_ip": options.public_ip or needs_public_ip(),
    }


def _graphql_string(value: str | None) -> str:
    # Safe to quote as is: every string here passed check_text (no quote, backslash or control).
    return "null" if value is None else f'"{value}"'


def _bid(spec: PodSpec) -> Decimal:
    bid = spec.offer.cost_per_hr
    if not isinstance(bid, Decimal) or not bid.is_finite() or not (0 < bid <= MAX_BID_PER_GPU):
        raise UnsafeValue(f"the bid per GPU must be a positive number of dollars up to {MAX_BID_PER_GPU}, not {bid!r}")
    return bid


def create_query(spec: PodSpec) -> str:
    """The create mutation for ``spec``: ``podFindAndDeployOnDemand`` in the SDK's shape (which
    cannot send ``containerRegistryAuthId``, review row 9), or ``podRentInterruptable`` at the
    offer's bid for an interruptible offer; every value checked (``create_arguments``)."""
    arguments = create_arguments(spec)
    env = ", ".join(f'{{key: "{key}", value: "{value}"}}' for key, value in arguments["env"].items())
    fields = []
    if spec.offer.interruptible:
        fields.append(f"bidPerGpu: {format(_bid(spec).normalize(), 'f')}")
    fields += [
        f"cloudType: {arguments['cloud_type']}",
        f"gpuCount: {arguments['gpu_count']}",
        f"gpuTypeId: {_graphql_string(arguments['gpu_type_id'])}",
        f"name: {_graphql_string(arguments['name'])}",
        f"imageName: {_graphql_string(arguments['image_name'])}",
        f"ports: {_graphql_string(arguments['ports'])}",
        f"containerDiskInGb: {arguments['container_disk_in_gb']}",
        f"volumeInGb: {arguments['volume_in_gb'] or 0}",
        f"volumeMountPath: {_graphql_string(arguments['volume_mount_path'])}",
        f"startSsh: {'true' if arguments['start_ssh'] else 'false'}",
        f"supportPublicIp: {'true' if arguments['support_public_ip'] else 'false'}",
        f"env: [{env}]",
    ]
    optional = {
        "dataCenterId": arguments["data_center_id"],
        "networkVolumeId": arguments["network_volume_id"],
        "containerRegistryAuthId": arguments["registry_auth_id"],
        "dockerArgs": arguments["docker_args"] or None,
    }
    fields += [f"{name}: {_graphql_string(value)}" for name, value in optional.items() if value]
    if arguments["allowed_cuda_versions"]:
        versions = ", ".join(_graphql_string(v) for v in arguments["allowed_cuda_versions"])
        fields.append(f"allowedCudaVersions: [{versions}]")
    mutation = "podRentInterruptable" if spec.offer.interruptible else "podFindAndDeployOnDemand"
    return f"mutation {{ {mutation}(input: {{ {', '.join(fields)} }}) {{ {CREATED_FIELDS} }} }}"


def interruptible_query(spec: PodSpec) -> str:
    """The ``podRentInterruptable`` mutation for ``spec`` at its offer's bid."""
    return create_query(replace(spec, offer=replace(spec.offer, interruptible=True)))


def rest_create_payload(spec: PodSpec) -> dict[str, Any]:
    """RunPod's REST create (``POST /pods``) for ``spec``: ``interruptible: true`` for a spot
    offer (no bid: RunPod's REST create takes none, review row 4). JSON: nothing pasted."""
    arguments = create_arguments(spec)
    payload: dict[str, Any] = {
        "name": arguments["name"],
        "imageName": arguments["image_name"],
        "gpuTypeIds": [arguments["gpu_type_id"]],
        "gpuCount": arguments["gpu_count"],
        "ports": arguments["ports"].split(","),
        "env": arguments["env"],
        "containerDiskInGb": arguments["container_disk_in_gb"],
        "volumeInGb": arguments["volume_in_gb"] or 0,
        "volumeMountPath": arguments["volume_mount_path"],
        "supportPublicIp": arguments["support_public_ip"],
        "interruptible": spec.offer.interruptible,
    }
    if arguments["cloud_type"] != "ALL":
        payload["cloudType"] = arguments["cloud_type"]
    optional = {
        "dataCenterIds": [arguments["data_center_id"]] if arguments["data_center_id"] else None,
        "networkVolumeId": arguments["network_volume_id"],
        "containerRegistryAuthId": arguments["registry_auth_id"],
        "allowedCudaVersions": arguments["allowed_cuda_versions"],
        "dockerStartCmd": arguments["docker_args"].split() if arguments["docker_args"] else None,
    }
    payload.update({name: value for name, value in optional.items() if value})
    return payload


def needs_public_ip() -> bool:
    """Whether pods are reached at their public IP (RUNPOD_POD_URL_TEMPLATE names ``{ip}``)."""
    return "{ip}" in settings.RUNPOD_POD_URL_TEMPLATE or "{public_port}" in settings.RUNPOD_POD_URL_TEMPLATE


def _whole(what: str, value: int | None) -> int | None:
    """A number the SDK pastes into GraphQL: a plain int (a bool or a str could carry anything)."""
    if value is None:
        return None
    if type(value) is not int or value < 0:
        raise UnsafeValue(f"{what} must be a whole number of GB, not {value!r}")
    return value


# -- reading pods ------------------------------------------------------------------------------------


def _pod_port(ports: str | None) -> int:
    """The pod server's port inside the pod: the first HTTP port the pod exposes."""
    for entry in (ports or "").split(","):
        number, _, kind = entry.strip().partition("/")
        if kind == "http" and number.isdigit():
            return int(number)
    return DEFAULT_POD_PORT


_JS_DATE = re.compile(r"(\w{3} \w{3} \d{1,2} \d{4} \d{2}:\d{2}:\d{2}) GMT([+-]\d{4})")
_ISO_DATE = re.compile(r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:Z|[+-]\d{2}:?\d{2})?")


def _status_changed_at(text: str | None) -> float | None:
    """When RunPod's ``lastStatusChange`` says the status changed ("Rented by User: Tue Dec 16 2025
    17:44:56 GMT+0000 (...)", or an ISO date), as a timestamp; None when it names no date."""
    text = text or ""
    if match := _JS_DATE.search(text):
        try:
            return datetime.strptime(f"{match.group(1)} {match.group(2)}", "%a %b %d %Y %H:%M:%S %z").timestamp()
        except ValueError:
            return None
    if match := _ISO_DATE.search(text):
        try:
            moment = datetime.fromisoformat(match.group().replace("Z", "+00:00"))
        except ValueError:
            return None
        return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()
    return None


def stop_cause(desired_status: str | None, last_status_change: str | None) -> tuple[str, bool]:
    """(StopCause, gone) of a pod RunPod no longer runs, from its status and the free text of
    ``lastStatusChange`` (runpodctl's internal/podstate, checked against RunPod's backend): an
    outbid writes "Outbid: <date>" on the EXITED or the TERMINATED path; a terminate writes
    EXITED with "Terminated by user/RunPod"; "Exited by Runpod" names no cause (an image that
    does not pull, a host fault, a balance run out), except "Insufficient balance" when it says so.
    ("", False) for a pod that runs."""
    status = (desired_status or "").upper()
    if status not in ("EXITED", "TERMINATED", "DEAD"):
        return "", False
    text = (last_status_change or "").lower()
    gone = status != "EXITED" or "terminated by" in text
    if "outbid" in text or "higher bid" in text:
        return StopCause.OUTBID, gone
    if "balance" in text or "spending limit" in text:
        return StopCause.BALANCE, gone
    if "by runpod" in text:
        return StopCause.PROVIDER, gone
    if "by user" in text:
        return StopCause.USER, gone
    return StopCause.UNKNOWN, gone


def _decimal(value: object) -> Decimal:
    try:
        return Decimal(str(value)) if value is not None else Decimal("0")
    except InvalidOperation:
        return Decimal("0")


# -- the provider ------------------------------------------------------------------------------------


class RunPodProvider:
    name = "runpod"

    def __init__(
        self,
        *,
        api_key: str | None = None,
        url_template: str | None = None,
        retry_delays: Sequence[float] | None = None,
        call_seconds: float | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.api_key = settings.RUNPOD_API_KEY if api_key is None else api_key
        self.url_template = url_template or settings.RUNPOD_POD_URL_TEMPLATE
        try:
            self.url_template.format(pod_id="x", port=1, ip="127.0.0.1", public_port=1)
        except (KeyError, IndexError, ValueError) as exc:
            raise ValueError(f"RUNPOD_POD_URL_TEMPLATE {self.url_template!r} is not usable: {exc!r}") from None
        if retry_delays is None:
            retry_delays = settings.RUNPOD_RETRY_DELAYS
        self.retry_delays = tuple(float(delay) for delay in retry_delays)
        self.call_seconds = settings.RUNPOD_CALL_SECONDS if call_seconds is None else call_seconds
        self._sleep = sleep

    # -- the Provider protocol -----------------------------------------------------------------------

    def create(self, spec: PodSpec) -> ProviderPod:
        query = create_query(spec)  # checks every value before any call
        tries = 0

        def deploy(seconds: float) -> dict[str, Any] | None:
            nonlocal tries
            tries += 1
            if tries > 1:
                # The failed try may have created the pod before its answer was lost: pod
                # names are unique per boot, so a pod with ours is that one, not a stranger.
                # (RunPod's listing lags a create: a pod it does not show yet is created twice, and
                # reconcile terminates the one no row names once its grace is over; review row 16.)
                listed_by = time.monotonic() + seconds
                for pod in self._pods(seconds):
                    if pod.get("name") == spec.name:
                        log.warning("create of %s: found the pod an earlier try made (%s)", spec.name, pod["id"])
                        return pod
                seconds = max(0.1, listed_by - time.monotonic())  # the list and the create share the time
            if spec.offer.interruptible:
                return self._create_interruptible(spec, query, seconds)
            return runpod_api.graphql(query, api_key=self.api_key, seconds=seconds)["podFindAndDeployOnDemand"]

        created = self._call("create", deploy)
        if not isinstance(created, dict) or not created.get("id"):
            # Some clients see "no capacity" as a null result with no error (review row 2).
            raise NoCapacity("RunPod created no pod (a null result)")
        return ProviderPod(
            provider_id=str(created["id"]),
            name=spec.name,
            running=False,
            # The rate RunPod charges, read back (an interruptible pod's: its bid, review row 15).
            cost_per_hr=_decimal(created.get("costPerHr")) or spec.offer.cost_per_hr,
            data_center=str((created.get("machine") or {}).get("dataCenterId") or ""),
        )

    def _create_interruptible(self, spec: PodSpec, query: str, seconds: float) -> dict[str, Any] | None:
        """The interruptible create: GraphQL's ``podRentInterruptable`` at our bid, or RunPod's REST
        create with ``interruptible: true`` once GraphQL refuses the mutation as unknown (RunPod
        staff, April 2026: it is being removed; review row 4)."""
        try:
            return runpod_api.graphql(query, api_key=self.api_key, seconds=seconds)["podRentInterruptable"]
        except runpod_api.UnknownOperation:
            log.warning("RunPod no longer knows podRentInterruptable: creating %s through REST", spec.name)
        return runpod_api.rest_create(rest_create_payload(spec), api_key=self.api_key, seconds=seconds)

    def get(self, provider_id: str) -> ProviderPod | None:
        """The pod, or None once RunPod no longer has it or it was terminated (a terminate writes
        EXITED "Terminated by user", review row 7). An outbid pod is returned, stopped, even on the
        TERMINATED path: it was preempted, not lost."""
        query = pod_queries.generate_pod_query(check_pod_id(provider_id))
        try:
            pod = self._call("get", lambda seconds: runpod_api.graphql(query, api_key=self.api_key, seconds=seconds))
        except runpod_api.PodGone:
            return None
        seen = pod.get("pod")
        if not isinstance(seen, dict):
            return None
        found = self._provider_pod(seen)
        return None if found.gone and found.stop_cause != StopCause.OUTBID else found

    def list(self, *, prefix: str) -> list[ProviderPod]:
        pods = [self._provider_pod(pod) for pod in self._call("list", self._pods) if isinstance(pod, dict)]
        return [
            pod for pod in pods if pod.name.startswith(prefix) and (not pod.gone or pod.stop_cause == StopCause.OUTBID)
        ]

    def terminate(self, provider_id: str) -> None:
        """Terminate the pod; one RunPod no longer knows counts as terminated."""
        query = pod_mutations.generate_pod_terminate_mutation(check_pod_id(provider_id))
        try:
            self._call("terminate", lambda seconds: runpod_api.graphql(query, api_key=self.api_key, seconds=seconds))
        except runpod_api.PodGone:
            log.info("pod %s was already gone", provider_id)

    def catalogue(self) -> list[Offer]:
        def fetch(seconds: float) -> list[dict[str, Any]]:
            return runpod_api.graphql(CATALOGUE_QUERY, api_key=self.api_key, seconds=seconds)["gpuTypes"] or []

        offers = []
        for gpu in self._call("catalogue", fetch):
            for cloud, available, price, lowest, spot in (
                ("SECURE", gpu.get("secureCloud"), gpu.get("securePrice"), "secureLowest", "secureSpotPrice"),
                (
                    "COMMUNITY",
                    gpu.get("communityCloud"),
                    gpu.get("communityPrice"),
                    "communityLowest",
                    "communitySpotPrice",
                ),
            ):
                # Spot prices differ by cloud (review row 3): each cloud's own minimum bid, else its spot price.
                min_bid = _decimal((gpu.get(lowest) or {}).get("minimumBidPrice")) or _decimal(gpu.get(spot)) or None
                if available and price:
                    offers.append(
                        Offer(gpu_type=gpu["id"], cloud_type=cloud, cost_per_hr=_decimal(price), min_bid=min_bid)
                    )
        return sorted(offers, key=lambda offer: (offer.cost_per_hr, offer.gpu_type, offer.cloud_type))

    # -- helpers -------------------------------------------------------------------------------------

    def _pods(self, seconds: float) -> list[Any]:
        data = runpod_api.graphql(pod_queries.QUERY_POD, api_key=self.api_key, seconds=seconds)
        return (data.get("myself") or {}).get("pods") or []

    def _call(self, what: str, function: Callable[[float], T]) -> T:
        """Run one RunPod call (given the seconds it may take); retry a Transient failure after the
        configured delays, each with full jitter and never sooner than the ``Retry-After`` RunPod
        named, all within ``call_seconds`` in total. A wait that would pass it raises the Transient
        (its ``retry_after`` kept), for the caller to come back later."""
        delays = list(self.retry_delays)
        deadline = time.monotonic() + self.call_seconds
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise Transient(f"RunPod {what}: no answer within {self.call_seconds:g} s")
            try:
                return function(min(left, runpod_api.CALL_SECONDS))
            except Transient as error:
                if not delays:
                    raise
                delay = max(random.uniform(0.5, 1.0) * delays.pop(0), error.retry_after or 0.0)
                if time.monotonic() + delay >= deadline:
                    raise
                log.warning("RunPod %s failed (%s); retrying in %.2f s", what, error, delay)
                self._sleep(delay)

    def _provider_pod(self, pod: dict[str, Any]) -> ProviderPod:
        pod_id = str(pod["id"])
        port = _pod_port(pod.get("ports"))
        runtime_ports = [p for p in (pod.get("runtime") or {}).get("ports") or [] if p.get("privatePort") == port]
        if needs_public_ip():
            # Only a public mapping is reached at its ip: RunPod gives HTTP ports a private IP and
            # TCP ports a public ip:port (review row 11); the pool must expose its port as TCP then.
            runtime_ports = sorted(
                (p for p in runtime_ports if p.get("isIpPublic")), key=lambda p: p.get("type") != "tcp"
            )
        mapping = next(iter(runtime_ports), None)
        base_url = ""
        if pod.get("desiredStatus") == "RUNNING" and mapping is not None:
            base_url = self.url_template.format(
                pod_id=pod_id, port=port, ip=mapping.get("ip") or "", public_port=mapping.get("publicPort") or ""
            ).rstrip("/")
        cause, gone = stop_cause(pod.get("desiredStatus"), pod.get("lastStatusChange"))
        changed_at = _status_changed_at(pod.get("lastStatusChange"))
        # Age from the status change's date; uptime only when it names none (uptime keeps climbing
        # on a stopped pod, which would push a preemption back toward the pod's start, review row 8).
        age = max(0.0, time.time() - changed_at) if changed_at is not None else float(pod.get("uptimeSeconds") or 0)
        return ProviderPod(
            provider_id=pod_id,
            name=str(pod.get("name") or ""),
            running=bool(base_url),
            base_url=base_url,
            cost_per_hr=_decimal(pod.get("costPerHr")),
            age_seconds=age,
            stopped=bool(cause),
            stop_cause=cause,
            gone=gone,
        )
