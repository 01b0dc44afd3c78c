"""RunPod pods through the official ``runpod`` SDK.

Every call blocks (the SDK uses ``requests``); callers run them in workers or a
thread, never on an event loop. The SDK reads ``RUNPOD_API_BASE_URL`` on each
call, so the simulator (``manage.py runpodsim``) needs no patching here.

What this module adds to the SDK:
- values are checked before they reach it: the SDK pastes strings into its
  GraphQL text unescaped, so a ``"`` in an env value would break or rewrite
  the query;
- failures are sorted into the provider errors (no capacity, unknown offer,
  auth, transient) and transient ones are retried with bounded back-off;
- a pod's base URL comes from ``RUNPOD_POD_URL_TEMPLATE``.

Length: every call of the SDK and the checks that guard it stay together, the interruptible
mutation the SDK lacks (``interruptible_query``) included: one place to read what reaches RunPod.

Settings (read from the environment in fleetadmin/settings.py): ``RUNPOD_API_KEY``
(or ``RUNPOD_API_KEY_FILE``), ``RUNPOD_POD_URL_TEMPLATE`` (the simulator prints the
one to use, ``http://{pod_id}-{port}.proxy.localhost:PORT``) and ``RUNPOD_RETRY_DELAYS``.
"""

from __future__ import annotations

import logging
import re
import time
import unicodedata
from collections.abc import Callable, Sequence
from datetime import datetime
from decimal import Decimal, InvalidOperation
from typing import Any, TypeVar

import pods.providers.sdk  # noqa: F401  (first: the SDK without its CPU probe subprocess)

# isort: split
import requests
import runpod
from django.conf import settings
from runpod.api.graphql import run_graphql_query
from runpod.error import AuthenticationError, QueryError

from pods.providers.base import (
    AuthFailed,
    NoCapacity,
    Offer,
    PodSpec,
    ProviderError,
    ProviderPod,
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
# get_gpu() costs one call per GPU type.
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
    lowestPrice(input: {gpuCount: 1}) {
      minimumBidPrice
      uninterruptablePrice
    }
  }
}
"""

# The SDK has no call for interruptible pods: this mutation goes through its run_graphql_query
# with values checked as create_pod's are (interruptible_query builds it).
INTERRUPTIBLE_FIELDS = "id imageName machineId costPerHr"
MAX_BID_PER_GPU = Decimal("1000")

NO_CAPACITY_PHRASES = (
    "no longer any instances available",
    "not enough free gpus",
    "below the minimum bid",  # outbid since the catalogue was read: as no capacity, for a while
)
TRANSIENT_PHRASES = ("something went wrong", "please try again later", "internal server error", "timed out")


class UnsafeValue(ProviderError, ValueError):
    """A value the SDK would paste unescaped into its GraphQL text; refused before any call."""


class _PodGone(ProviderError):
    """RunPod says the pod does not exist (get: None, terminate: already done)."""


# -- checking values before the SDK sees them ---------------------------------------------------------

_ENV_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_PORTS = re.compile(r"\d{1,5}/(?:http|tcp)(?:,\d{1,5}/(?:http|tcp))*")
_DATA_CENTER = re.compile(r"[A-Za-z0-9][A-Za-z0-9-]*")
_IMAGE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/:@+-]*")
_POD_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")
_MOUNT_PATH = re.compile(r"/[A-Za-z0-9._/-]*")
_VOLUME_ID = re.compile(r"[A-Za-z0-9]+")
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
    """The keyword arguments for ``runpod.create_pod``, every string checked."""
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
        "container_disk_in_gb": _whole("container disk", options.container_disk_gb),
        "volume_in_gb": _whole("volume size", options.volume_gb),
        "volume_mount_path": check_text("volume mount path", options.volume_mount_path, _MOUNT_PATH),
        "network_volume_id": check_text("network volume id", options.network_volume_id, _VOLUME_ID)
        if options.network_volume_id
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


def interruptible_query(spec: PodSpec) -> str:
    """The ``podRentInterruptable`` mutation for ``spec`` at its offer's bid, every value checked
    as for ``create_pod`` (``create_arguments``), the bid a plain positive decimal."""
    arguments = create_arguments(spec)
    bid = spec.offer.cost_per_hr
    if not isinstance(bid, Decimal) or not bid.is_finite() or not (0 < bid <= MAX_BID_PER_GPU):
        raise UnsafeValue(f"the bid per GPU must be a positive number of dollars up to {MAX_BID_PER_GPU}, not {bid!r}")
    env = ", ".join(f'{{key: "{key}", value: "{value}"}}' for key, value in arguments["env"].items())
    fields = [
        f"bidPerGpu: {format(bid.normalize(), 'f')}",
        f"cloudType: {arguments['cloud_type']}",
        f"gpuCount: {arguments['gpu_count']}",
        f"gpuTypeId: {_graphql_string(arguments['gpu_type_id'])}",
        f"name: {_graphql_string(arguments['name'])}",
        f"imageName: {_graphql_string(arguments['image_name'])}",
        f"ports: {_graphql_string(arguments['ports'])}",
        f"volumeInGb: {arguments['volume_in_gb'] or 0}",
        f"volumeMountPath: {_graphql_string(arguments['volume_mount_path'])}",
        f"startSsh: {'true' if arguments['start_ssh'] else 'false'}",
        f"supportPublicIp: {'true' if arguments['support_public_ip'] else 'false'}",
        f"env: [{env}]",
    ]
    if arguments["data_center_id"]:
        fields.append(f"dataCenterId: {_graphql_string(arguments['data_center_id'])}")
    if arguments["container_disk_in_gb"] is not None:
        fields.append(f"containerDiskInGb: {arguments['container_disk_in_gb']}")
    if arguments["network_volume_id"]:
        fields.append(f"networkVolumeId: {_graphql_string(arguments['network_volume_id'])}")
    if arguments["allowed_cuda_versions"]:
        versions = ", ".join(_graphql_string(v) for v in arguments["allowed_cuda_versions"])
        fields.append(f"allowedCudaVersions: [{versions}]")
    if arguments["docker_args"]:
        fields.append(f"dockerArgs: {_graphql_string(arguments['docker_args'])}")
    return f"mutation {{ podRentInterruptable(input: {{ {', '.join(fields)} }}) {{ {INTERRUPTIBLE_FIELDS} }} }}"


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


# -- sorting the SDK's failures ----------------------------------------------------------------------


def classify(exc: Exception) -> ProviderError | None:
    """The provider error that says how a caller should react to an SDK failure (None: not the SDK's)."""
    if isinstance(exc, ProviderError):
        return exc
    if isinstance(exc, AuthenticationError):
        return AuthFailed(f"RunPod refused the API key: {exc}")
    # Before ValueError: requests' JSONDecodeError is one too, and means a gateway page or a 5xx.
    if isinstance(exc, requests.exceptions.RequestException):
        return Transient(f"RunPod unreachable or answered garbage: {type(exc).__name__}: {exc}")
    if isinstance(exc, QueryError):
        message = str(exc)
        lowered = message.lower()
        if any(phrase in lowered for phrase in NO_CAPACITY_PHRASES):
            return NoCapacity(message)
        if any(phrase in lowered for phrase in TRANSIENT_PHRASES):
            return Transient(message)
        if "not found" in lowered:
            return _PodGone(message)
        if "unauthorized" in lowered or "api key" in lowered:
            return AuthFailed(message)
        return ProviderError(f"RunPod refused the request: {message}")
    if isinstance(exc, ValueError):
        # get_gpu() raises ValueError for an id gpuTypes does not know.
        if "no gpu found" in str(exc).lower():
            return UnknownOffer(str(exc))
        return ProviderError(f"RunPod SDK refused the request: {exc}")
    if isinstance(exc, KeyError | TypeError):
        # A 5xx with a JSON body that is not GraphQL: the SDK indexes into a missing "data".
        return Transient(f"RunPod answered without data: {type(exc).__name__}: {exc}")
    return None


# -- reading pods ------------------------------------------------------------------------------------


def _pod_port(ports: str | None) -> int:
    """The pod server's port inside the pod: the first HTTP port the pod exposes."""
    for entry in (ports or "").split(","):
        number, _, kind = entry.strip().partition("/")
        if kind == "http" and number.isdigit():
            return int(number)
    return DEFAULT_POD_PORT


_JS_DATE = re.compile(r"(\w{3} \w{3} \d{1,2} \d{4} \d{2}:\d{2}:\d{2}) GMT([+-]\d{4})")


def _age_from_status_change(text: str | None) -> float:
    """Seconds since RunPod's ``lastStatusChange`` ("Rented by User: Tue Dec 16 2025 17:44:56 GMT+0000 (...)")."""
    match = _JS_DATE.search(text or "")
    if match is None:
        return 0.0
    try:
        moment = datetime.strptime(f"{match.group(1)} {match.group(2)}", "%a %b %d %Y %H:%M:%S %z")
    except ValueError:
        return 0.0
    return max(0.0, time.time() - moment.timestamp())


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
        self._sleep = sleep

    # -- the Provider protocol -----------------------------------------------------------------------

    def create(self, spec: PodSpec) -> ProviderPod:
        # Interruptible pods: the SDK has no call for them, its run_graphql_query sends our mutation.
        query = interruptible_query(spec) if spec.offer.interruptible else None
        arguments = create_arguments(spec)
        tries = 0

        def deploy() -> dict[str, Any]:
            nonlocal tries
            tries += 1
            if tries > 1:
                # The failed try may have created the pod before its answer was lost: pod
                # names are unique per boot, so a pod with ours is that one, not a stranger.
                for pod in runpod.get_pods():
                    if pod.get("name") == spec.name:
                        log.warning("create of %s: found the pod an earlier try made (%s)", spec.name, pod["id"])
                        return pod
            if query is not None:
                return run_graphql_query(query, api_key=self.api_key)["data"]["podRentInterruptable"]
            return runpod.create_pod(**arguments)

        created = self._call("create", deploy)
        return ProviderPod(
            provider_id=str(created["id"]),
            name=spec.name,
            running=False,
            cost_per_hr=spec.offer.cost_per_hr,
        )

    def get(self, provider_id: str) -> ProviderPod | None:
        check_pod_id(provider_id)
        try:
            pod = self._call("get", runpod.get_pod, provider_id)
        except _PodGone:
            return None
        if pod is None or pod.get("desiredStatus") == "TERMINATED":
            return None
        return self._provider_pod(pod)

    def list(self, *, prefix: str) -> list[ProviderPod]:
        pods = self._call("list", runpod.get_pods) or []
        return [
            self._provider_pod(pod)
            for pod in pods
            if str(pod.get("name") or "").startswith(prefix) and pod.get("desiredStatus") != "TERMINATED"
        ]

    def terminate(self, provider_id: str) -> None:
        """Terminate the pod; one RunPod no longer knows counts as terminated."""
        check_pod_id(provider_id)
        try:
            self._call("terminate", runpod.terminate_pod, provider_id)
        except _PodGone:
            log.info("pod %s was already gone", provider_id)

    def catalogue(self) -> list[Offer]:
        def fetch() -> list[dict[str, Any]]:
            return run_graphql_query(CATALOGUE_QUERY, api_key=self.api_key)["data"]["gpuTypes"] or []

        offers = []
        for gpu in self._call("catalogue", fetch):
            min_bid = _decimal((gpu.get("lowestPrice") or {}).get("minimumBidPrice")) or None
            for cloud, available, price in (
                ("SECURE", gpu.get("secureCloud"), gpu.get("securePrice")),
                ("COMMUNITY", gpu.get("communityCloud"), gpu.get("communityPrice")),
            ):
                if available and price:
                    offers.append(
                        Offer(gpu_type=gpu["id"], cloud_type=cloud, cost_per_hr=_decimal(price), min_bid=min_bid)
                    )
        return sorted(offers, key=lambda offer: (offer.cost_per_hr, offer.gpu_type, offer.cloud_type))

    # -- helpers -------------------------------------------------------------------------------------

    def _call(self, what: str, function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run an SDK call, sorting its failures; retry Transient ones after the configured delays."""
        delays = list(self.retry_delays)
        while True:
            # create_pod, terminate_pod and friends take no key argument: the SDK reads this global.
            runpod.api_key = self.api_key
            try:
                return function(*args, **kwargs)
            except Exception as exc:
                error = classify(exc)
                if error is None or error is exc:
                    raise
                if not isinstance(error, Transient) or not delays:
                    raise error from exc
                delay = delays.pop(0)
                log.warning("RunPod %s failed (%s); retrying in %.2f s", what, error, delay)
                self._sleep(delay)

    def _provider_pod(self, pod: dict[str, Any]) -> ProviderPod:
        pod_id = str(pod["id"])
        port = _pod_port(pod.get("ports"))
        runtime_ports = (pod.get("runtime") or {}).get("ports") or []
        mapping = next((p for p in runtime_ports if p.get("privatePort") == port), None)
        base_url = ""
        if pod.get("desiredStatus") == "RUNNING" and mapping is not None:
            base_url = self.url_template.format(
                pod_id=pod_id, port=port, ip=mapping.get("ip") or "", public_port=mapping.get("publicPort") or ""
            ).rstrip("/")
        age = max(float(pod.get("uptimeSeconds") or 0), _age_from_status_change(pod.get("lastStatusChange")))
        return ProviderPod(
            provider_id=pod_id,
            name=str(pod.get("name") or ""),
            running=bool(base_url),
            base_url=base_url,
            cost_per_hr=_decimal(pod.get("costPerHr")),
            age_seconds=age,
            stopped=pod.get("desiredStatus") == "EXITED",
        )
