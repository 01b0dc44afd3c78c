"""What every pod provider offers: create, get, list, terminate, catalogue.

Calls block (they talk to another machine or start processes): they run in
worker tasks or in a thread, never on an event loop.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal
from typing import Protocol


class ProviderError(Exception):
    """Base of the errors a provider sorts its failures into."""


class NoCapacity(ProviderError):
    """The candidate has no machine free now: skip it, try the next one."""


class UnknownOffer(ProviderError):
    """The GPU type or data centre does not exist: the pool config is wrong."""


class AuthFailed(ProviderError):
    """The provider refused our credentials: stop booting and alert."""


class Transient(ProviderError):
    """Network fault, 429 or 5xx: retry with back-off (no sooner than ``retry_after`` seconds,
    when the provider named a time)."""

    retry_after: float | None = None


class BadRequest(ProviderError):
    """The provider refused this request as it stands (a rule or a value it names): this
    candidate gives no pod now; the walk goes on to the next."""


class Balance(ProviderError):
    """The account's balance or spending limit refuses new pods: stop booting and alert."""


@dataclass(frozen=True)
class Offer:
    """One (GPU type, cloud, data centre) a pod can be created on, with its price."""

    gpu_type: str
    cloud_type: str = ""
    data_center: str = ""
    cost_per_hr: Decimal = Decimal("0")  # an interruptible candidate's: its bid (pods.planning.priced)
    # Interruptible (spot): rented at a bid, taken back by the provider when someone pays more.
    interruptible: bool = False
    bid_margin: Decimal = Decimal("0")  # $/h over the catalogue's minimum bid (the pool's bid rule)
    min_bid: Decimal | None = None  # the catalogue's minimum bid per GPU ($/h); None: unknown

    @property
    def key(self) -> str:
        return f"{self.gpu_type}|{self.cloud_type}|{self.data_center}" + ("|spot" if self.interruptible else "")


@dataclass(frozen=True)
class PodOptions:
    """RunPod's create settings that a pool may set, beyond image, ports and env."""

    container_disk_gb: int | None = None  # None: DEFAULT_CONTAINER_DISK_GB, sent for every create
    volume_gb: int = 0
    volume_mount_path: str = "/runpod-volume"
    network_volume_id: str = ""
    registry_auth_id: str = ""  # RunPod's saved registry credentials for a private image
    allowed_cuda_versions: tuple[str, ...] = ()
    docker_args: str = ""
    ssh: bool = False  # RunPod's SSH service in the pod (off: nothing but the pod's HTTP port)
    public_ip: bool = False  # a public IP for the pod (off: reached through RunPod's proxy)


@dataclass(frozen=True)
class PodSpec:
    name: str
    lanes: int
    offer: Offer
    image: str = ""
    ports: str = ""
    env: dict[str, str] = field(default_factory=dict, repr=False)  # holds the pod's token
    page_timeout: float = 120.0
    options: PodOptions = field(default_factory=PodOptions)


@dataclass(frozen=True)
class ProviderPod:
    provider_id: str
    name: str
    running: bool  # the provider says it runs and its HTTP port is reachable
    base_url: str = ""  # empty until the provider exposes the port
    cost_per_hr: Decimal = Decimal("0")
    age_seconds: float = 0.0  # since it was created, or since its last status change when stopped
    stopped: bool = False  # the provider stopped it (why: ``stop_cause``)
    stop_cause: str = ""  # a StopCause when stopped
    gone: bool = False  # terminated (still listed for a while, or vanished with an outbid)
    data_center: str = ""  # where the provider placed it, when it says (RunPod: machine.dataCenterId)


class StopCause:
    """Why the provider stopped a pod, as far as it says (RunPod: ``lastStatusChange``)."""

    OUTBID = "outbid"  # an interruptible pod lost its machine to a higher bid: preempted
    BALANCE = "balance"  # the account ran out of money: every pod stops, and no new one boots
    PROVIDER = "provider"  # stopped by the provider for another reason (image pull, host fault)
    USER = "user"  # stopped or terminated by the account (us, or a person with the key)
    UNKNOWN = "unknown"  # no cause given: for an interruptible pod, possibly preempted


class Provider(Protocol):
    name: str

    def create(self, spec: PodSpec) -> ProviderPod: ...

    def get(self, provider_id: str) -> ProviderPod | None: ...

    def list(self, *, prefix: str) -> list[ProviderPod]: ...

    def terminate(self, provider_id: str) -> None: ...

    def catalogue(self) -> list[Offer]: ...
