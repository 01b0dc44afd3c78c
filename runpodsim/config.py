"""Simulator configuration: the GPU catalogue, its free capacity, timings and injected faults.

Read from a JSON file (``runpodsim --config FILE``) or built in Python. Unknown
keys are refused so that a typo in a benchmark's config does not silently leave
a fault out.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator

Cloud = Literal["SECURE", "COMMUNITY"]

NO_CAPACITY_MESSAGE = (
    "There are no longer any instances available with the requested specifications. Please refresh and try again."
)
NO_GPUS_ON_HOST_MESSAGE = "There are not enough free GPUs on the host machine to start this pod."
SOMETHING_WENT_WRONG_MESSAGE = "Something went wrong. Please try again later or contact support."
# Every way RunPod was seen to say "no capacity" (review runpod-fidelity-8630753, rows 1 and 2):
# (message, extensions.code). The spot wording ends like a transient fault.
CAPACITY_WORDINGS: dict[str, tuple[str, str | None]] = {
    "on_demand": (NO_CAPACITY_MESSAGE, None),
    "spot": (
        "There are no instances available with the request specifications. Please try again later.",
        None,
    ),
    "rest": ("There are no instances available with the requested specifications.", None),
    "coded": ("This machine does not have the resources to deploy your pod.", "SUPPLY_CONSTRAINT"),
    "host": (NO_GPUS_ON_HOST_MESSAGE, None),
}
INSUFFICIENT_BALANCE_MESSAGE = "You do not have enough funds to rent this pod. Please add funds to your account."
SPENDING_LIMIT_MESSAGE = "This pod would take your account over its spending limit."
BID_REFUSED_MESSAGE = "Your bid is below the minimum bid price for this GPU type."
# Realistic mode's image pulls (seconds of real time): a slow pull of a large image (dstack waits
# up to 20 min for one) and a pull that fails (a bad tag, a registry down) after a minute.
REALISTIC_SLOW_PULL_S = 180.0
REALISTIC_FAILED_PULL_S = 60.0


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class GpuTypeConfig(_Strict):
    """One GPU type; ``capacity`` is free GPUs per cloud and data centre (absent means none)."""

    id: str = Field(min_length=1)
    display_name: str = Field("", alias="displayName")
    memory_in_gb: int = Field(24, alias="memoryInGb", ge=0)
    secure_price: float | None = Field(None, alias="securePrice", ge=0)
    community_price: float | None = Field(None, alias="communityPrice", ge=0)
    max_gpu_count: int = Field(8, alias="maxGpuCount", ge=1)
    capacity: dict[Cloud, dict[str, Annotated[int, Field(ge=0)]]] = Field(default_factory=dict)
    # Lanes its pods report whatever LANES says, as a pod image that sizes itself to its GPU does.
    pod_lanes: int | None = Field(None, alias="podLanes", ge=1, le=256)
    # The lowest bid per GPU ($/h) an interruptible pod is rented at (lowestPrice.minimumBidPrice);
    # absent: 60 % of the community price (none without one: no interruptible pods of this type).
    minimum_bid_price: float | None = Field(None, alias="minimumBidPrice", gt=0)
    # Secure cloud's own lowest bid (secureSpotPrice); absent: minimum_bid_price, else 60 % of the
    # secure price. Spot prices differ by cloud (review row 3).
    secure_minimum_bid_price: float | None = Field(None, alias="secureMinimumBidPrice", gt=0)

    def price(self, cloud: str) -> float | None:
        return self.secure_price if cloud == "SECURE" else self.community_price

    def minimum_bid(self, cloud: str = "COMMUNITY") -> float | None:
        if cloud == "SECURE":
            if self.secure_minimum_bid_price is not None:
                return self.secure_minimum_bid_price
            if self.minimum_bid_price is not None:
                return self.minimum_bid_price
            return None if self.secure_price is None else round(self.secure_price * 0.6, 4)
        if self.minimum_bid_price is not None:
            return self.minimum_bid_price
        return None if self.community_price is None else round(self.community_price * 0.6, 4)


class Trigger(_Strict):
    """When a fault fires: for the next ``count`` matching calls, each with ``probability``, or always.

    ``operation`` narrows it to one GraphQL root field (``podFindAndDeployOnDemand``,
    ``gpuTypes``, ``pod``, ``myself``, ``podTerminate`` ...). With a ``seed`` the
    random draws repeat from run to run.
    """

    count: int | None = Field(None, ge=0)
    probability: float | None = Field(None, ge=0, le=1)
    seed: int | None = None
    operation: str | None = None
    _rng: random.Random = PrivateAttr(default_factory=random.Random)

    def model_post_init(self, context: object) -> None:
        self._rng = random.Random(self.seed)

    def fires(self, operation: str | None = None) -> bool:
        if self.operation is not None and operation != self.operation:
            return False
        if self.count is not None and self.count <= 0:
            return False
        if self.probability is not None and self._rng.random() >= self.probability:
            return False
        if self.count is not None:
            self.count -= 1
        return True


class HttpErrorFault(Trigger):
    """Answer an HTTP error: ``body`` "text" is a gateway page (HTML: Cloudflare's 403 challenge, a
    502), "json" carries RunPod's "Something went wrong" error. With ``after_execute`` the
    call takes effect first and only its answer is lost (a create whose reply never came)."""

    kind: Literal["http_error"]
    status: int = Field(502, ge=400, le=599)
    body: Literal["text", "json"] = "text"
    after_execute: bool = False


class RateLimitFault(Trigger):
    """Answer 429 with ``Retry-After`` (seconds), the body an HTML page or RunPod's JSON error."""

    kind: Literal["rate_limit"]
    retry_after_s: float = Field(1.0, ge=0)
    body: Literal["text", "json"] = "json"


class ErrorFault(Trigger):
    """Answer a GraphQL error (HTTP 200) with this message and ``extensions.code``, the call not
    run: a wording a test needs (INSUFFICIENT_BALANCE, an unknown refusal, a capacity text)."""

    kind: Literal["graphql_error"]
    message: str = Field(min_length=1)
    code: str | None = None


class NullResultFault(Trigger):
    """A create answers ``{"data": {"<mutation>": null}}``, no error and no pod (review row 2)."""

    kind: Literal["null_result"]


class CapacityWordingFault(Trigger):
    """A "no capacity" answer given while this fires uses this wording (CAPACITY_WORDINGS)."""

    kind: Literal["capacity_wording"]
    wording: Literal["on_demand", "spot", "rest", "coded", "host"]


class RuntimeNullFault(Trigger):
    """A pod read while this fires shows ``runtime: null``, as RunPod's 2 s telemetry lookup does
    when it times out (review row 17)."""

    kind: Literal["runtime_null"]


class PodExitFault(Trigger):
    """Pods created while this fires are stopped by RunPod ``after_s`` after their create:
    "Exited by Runpod" with no cause (``image``: a pull that fails, it never runs; ``host``: a
    host fault) or "Exited by RunPod: Insufficient balance" (``balance``)."""

    kind: Literal["pod_exit"]
    cause: Literal["image", "host", "balance"] = "host"
    after_s: float = Field(0.0, ge=0)


class ImagePullFault(Trigger):
    """Pods created while this fires spend ``pull_s`` (the simulator's clock) pulling their image
    before they boot: ``desiredStatus`` RUNNING, ``runtime`` null, billed (RunPod bills from the
    create; large images pull for minutes, dstack waits 20 min; review row 17). With ``fails`` the
    pull fails at its end: the pod never runs, RunPod stops it "Exited by Runpod" (an image fault,
    not a preemption)."""

    kind: Literal["image_pull"]
    pull_s: float = Field(ge=0, le=86400)
    fails: bool = False


class UnknownMutationFault(Trigger):
    """GraphQL no longer knows ``podRentInterruptable``, as RunPod staff said it would (review row 4)."""

    kind: Literal["unknown_mutation"]


class SlowFault(Trigger):
    """Answer late. With ``after_execute`` the call takes effect at once and only its
    answer waits: a client killed meanwhile leaves a pod it never heard of."""

    kind: Literal["slow"]
    delay_s: float = Field(ge=0)
    after_execute: bool = False


class BadKeyFault(Trigger):
    """Answer 401 whatever key was sent, as after a key was revoked."""

    kind: Literal["bad_key"]


class NoCapacityFault(_Strict):
    """Creates matching these filters (None matches anything) find no machine."""

    kind: Literal["no_capacity"]
    gpu: str | None = None
    cloud: Cloud | None = None
    data_center: str | None = None

    def matches(self, gpu: str, cloud: str, data_center: str) -> bool:
        return (
            (self.gpu is None or self.gpu == gpu)
            and (self.cloud is None or self.cloud == cloud)
            and (self.data_center is None or self.data_center == data_center)
        )


class BootStuckFault(Trigger):
    """Pods created while this fires never get runtime ports (a machine that never comes up)."""

    kind: Literal["boot_stuck"]


class ModelFailFault(Trigger):
    """Pods created while this fires boot, but their /healthz answers 503 "failed"."""

    kind: Literal["model_fail"]


class ProxyTimeoutFault(Trigger):
    """Pages asked of any virtual pod while this fires are cut by RunPod's proxy: 524 with
    Cloudflare's HTML page (the real proxy answers so after 100 s; here at once)."""

    kind: Literal["proxy_timeout"]


Fault = Annotated[
    HttpErrorFault
    | SlowFault
    | BadKeyFault
    | NoCapacityFault
    | BootStuckFault
    | ModelFailFault
    | ProxyTimeoutFault
    | RateLimitFault
    | ErrorFault
    | NullResultFault
    | CapacityWordingFault
    | RuntimeNullFault
    | PodExitFault
    | ImagePullFault
    | UnknownMutationFault,
    Field(discriminator="kind"),
]


class FaultList(_Strict):
    faults: list[Fault] = Field(default_factory=list)


def _default_gpu_types() -> list[GpuTypeConfig]:
    return [
        GpuTypeConfig(
            id="NVIDIA GeForce RTX 4090",
            display_name="RTX 4090",
            memory_in_gb=24,
            secure_price=0.69,
            community_price=0.34,
            capacity={"SECURE": {"EU-RO-1": 8, "US-TX-3": 8}, "COMMUNITY": {"EU-SE-1": 8}},
        ),
        GpuTypeConfig(
            id="NVIDIA RTX A5000",
            display_name="RTX A5000",
            memory_in_gb=24,
            secure_price=0.27,
            community_price=0.16,
            capacity={"SECURE": {"EU-RO-1": 8}, "COMMUNITY": {"EU-SE-1": 8, "US-TX-3": 8}},
        ),
        GpuTypeConfig(
            id="NVIDIA A40",
            display_name="A40",
            memory_in_gb=48,
            secure_price=0.40,
            community_price=None,
            capacity={"SECURE": {"EU-RO-1": 4, "US-KS-2": 4}},
        ),
    ]


class SimConfig(_Strict):
    api_key: str = "sim-key"
    public_host: str = "127.0.0.1"  # the address pods' runtime.ports advertise
    # The pod URL template it announces (Endpoint.pod_url_template). False: each pod under a host of
    # its own, http://{pod_id}-{port}.proxy.localhost:PORT, as RunPod's proxy names pods. True: every
    # pod under http://HOST:PORT/pods/{pod_id}, as a deployment that reaches its pods through one
    # gateway does. Both are always served.
    gateway: bool = False
    # HTTP ports' runtime entries carry the public host, as no RunPod pod's do (review row 11: a
    # pod's HTTP port has a private IP; only TCP ports get a public ip:port). Realistic: false.
    http_ports_public: bool = True
    boot_delay_s: float = Field(1.0, ge=0)
    model_load_s: float = Field(0.5, ge=0)
    page_latency_s: float = Field(0.05, ge=0)
    default_lanes: int = Field(1, ge=1, le=256)  # when a pod's env has no LANES
    languages: list[str] = Field(default_factory=lambda: ["eng", "deu", "fra", "spa", "ita", "nld", "por"])
    max_page_bytes: int = Field(50 * 1024 * 1024, ge=1)
    # Each virtual pod's document cache, as the pod server's DOCUMENT_CACHE_BYTES and MAX_DOCUMENT_BYTES.
    document_cache_bytes: int = Field(2 * 1024**3, ge=1)
    max_document_bytes: int = Field(512 * 1024**2, ge=1)
    gpu_types: list[GpuTypeConfig] = Field(default_factory=_default_gpu_types)
    faults: list[Fault] = Field(default_factory=list)
    # Interruptible pods are preempted at this rate per pod-hour (a Poisson process on the
    # simulator's clock: each pod's moment is drawn when it is rented, from preempt_seed's
    # generator, so a run with a seed preempts the same pods at the same ages).
    preempt_rate_per_hour: float = Field(0.0, ge=0, le=3600)
    preempt_seed: int | None = None
    # The share of preemptions on RunPod's TERMINATED path: the pod leaves the listing at once
    # (its own query still says "Outbid"); the rest stop as EXITED "Outbid: <date>" (review row 5).
    preempt_terminated_share: float = Field(0.0, ge=0, le=1)
    # Listing lag: a created pod shows in ``myself.pods`` this long after its create, and a
    # terminated one stays listed (EXITED, "Terminated by user") this long; 0 is instant.
    listing_lag_s: float = Field(0.0, ge=0, le=3600)
    # A terminate writes EXITED + "Terminated by user: <date>" (RunPod's backend does), and the pod
    # answers its own query so for this long before it is gone; 0: gone at once.
    terminated_linger_s: float = Field(0.0, ge=0, le=3600)
    # $/h the account may be spending at once: a create that would pass it is refused
    # (INSUFFICIENT_BALANCE). None: no limit.
    spending_limit_per_hr: float | None = Field(None, ge=0)
    # Images pulled only with one of ``registry_auth_ids`` named as containerRegistryAuthId; a pod
    # of a private image created without one never runs: "Exited by Runpod" (review row 9).
    private_images: list[str] = Field(default_factory=list)
    registry_auth_ids: list[str] = Field(default_factory=list)

    @field_validator("gpu_types")
    @classmethod
    def _unique_ids(cls, value: list[GpuTypeConfig]) -> list[GpuTypeConfig]:
        ids = [gpu.id for gpu in value]
        duplicates = sorted({gpu_id for gpu_id in ids if ids.count(gpu_id) > 1})
        if duplicates:
            raise ValueError(f"duplicate GPU type ids: {duplicates}")
        return value

    @classmethod
    def load(cls, path: str | Path) -> SimConfig:
        return cls.model_validate_json(Path(path).read_text())

    def realistic(self, *, seed: int | None = None, time_scale: float = 1.0) -> SimConfig:
        """This config as hard as RunPod: every behaviour of issue 39 at a plausible rate (the
        storm's ``--realistic``): capacity in every wording and a null result now and then, 429s with
        Retry-After, HTML gateway pages, runtime reading null, listing lag, terminate writing
        EXITED, preemptions on both paths, a pod now and then stopped by RunPod for its host, image
        pulls of minutes and now and then one that fails. ``time_scale``: a second of the
        simulator's clock stands for this many real ones (a run that compresses a job into minutes,
        bench/spot.py's ``--time-scale``): the pulls' minutes are divided by it."""
        if not time_scale > 0:
            raise ValueError(f"time_scale must be positive, not {time_scale!r}")
        faults: list[dict] = [
            {"kind": "rate_limit", "probability": 0.03, "retry_after_s": 1.0},
            {"kind": "http_error", "status": 502, "body": "text", "probability": 0.01},
            {"kind": "http_error", "status": 403, "body": "text", "probability": 0.005},
            {"kind": "runtime_null", "probability": 0.05, "operation": "pod"},
            {"kind": "null_result", "probability": 0.02, "operation": "podFindAndDeployOnDemand"},
            {"kind": "capacity_wording", "wording": "spot", "probability": 0.3},
            {"kind": "capacity_wording", "wording": "rest", "probability": 0.3},
            {"kind": "capacity_wording", "wording": "coded", "probability": 0.3},
            {"kind": "pod_exit", "cause": "host", "after_s": 30.0, "probability": 0.01},
            # A pull that fails ("Exited by Runpod") after a minute, else a slow pull of three.
            {"kind": "image_pull", "pull_s": REALISTIC_FAILED_PULL_S / time_scale, "fails": True, "probability": 0.02},
            {"kind": "image_pull", "pull_s": REALISTIC_SLOW_PULL_S / time_scale, "probability": 0.1},
        ]
        if seed is not None:  # a seed of its own for each fault: the same seed would fire them together
            faults = [{**fault, "seed": seed * 1000 + index} for index, fault in enumerate(faults)]
        return self.model_validate(
            {
                **self.model_dump(by_alias=False),
                "faults": [*[f.model_dump() for f in self.faults], *faults],
                "http_ports_public": False,
                "listing_lag_s": max(self.listing_lag_s, 2.0),
                "terminated_linger_s": max(self.terminated_linger_s, 5.0),
                "preempt_terminated_share": max(self.preempt_terminated_share, 0.5),
            }
        )
