"""The simulated RunPod account: GPU stock, pods and their lifecycle, faults and counters.

Plain synchronous code with no I/O, driven by the aiohttp handlers on one event
loop (so it needs no locks) and testable on its own. Pod lifecycle is computed
from timestamps when asked, not driven by timers: a hundred idle pods cost
nothing but their dicts.

Length: a test and benchmark tool, not the product; one class answers every GraphQL
operation the SDK sends against one account's state, so its handlers stay together.
"""

from __future__ import annotations

import random
import secrets
import time
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from runpodsim import graphql
from runpodsim.config import (
    BID_REFUSED_MESSAGE,
    CAPACITY_WORDINGS,
    INSUFFICIENT_BALANCE_MESSAGE,
    NO_GPUS_ON_HOST_MESSAGE,
    SPENDING_LIMIT_MESSAGE,
    BadKeyFault,
    BootStuckFault,
    CapacityWordingFault,
    ErrorFault,
    Fault,
    GpuTypeConfig,
    HttpErrorFault,
    ImagePullFault,
    ModelFailFault,
    NoCapacityFault,
    NullResultFault,
    PodExitFault,
    ProxyTimeoutFault,
    RateLimitFault,
    RuntimeNullFault,
    SimConfig,
    SlowFault,
    UnknownMutationFault,
)
from runpodsim.schema import RUNPOD_SCHEMA

LOADING, READY, FAILED = "loading", "ok", "failed"


@dataclass
class CachedDocument:
    size: int
    pages: int
    in_use: int = 0  # pages being read from it now: not evicted under them


@dataclass
class VirtualPod:
    id: str
    name: str
    image: str
    env: dict[str, str]
    gpu: GpuTypeConfig
    cloud: str
    data_center: str
    gpu_count: int
    cost_per_hr: float
    ports: str
    lanes: int
    created_wall: float
    started_at: float | None  # monotonic; None while stopped
    status_changed_wall: float
    status_event: str = "Rented by User"
    desired_status: str = "RUNNING"
    stuck: bool = False
    pull_s: float = 0.0  # pulling its image this long before its boot_delay_s begins (ImagePullFault)
    model_fails: bool = False
    container_disk_in_gb: int | None = None  # None: the create sent none (review row 10)
    registry_auth_id: str = ""
    volume_in_gb: int = 0
    volume_mount_path: str = "/runpod-volume"
    docker_args: str = ""
    network_volume_id: str = ""
    allowed_cuda_versions: list[str] = field(default_factory=list)
    interruptible: bool = False
    preempt_at: float | None = None  # the simulator's clock: when the provider takes it back
    preempted: bool = False
    # Autostop (issue 39): the pod server in it exits once nobody with its token has asked it
    # anything for AUTOSTOP_SECONDS (its env), and with it the container: EXITED, GPUs freed.
    autostop_s: float = 0.0
    last_contact: float = 0.0  # the simulator's clock: the last request that carried the token
    autostopped: bool = False
    created_at: float = 0.0  # the simulator's clock: listed in myself.pods listing_lag_s after
    exit_at: float | None = None  # the simulator's clock: when RunPod stops it (PodExitFault)
    exit_event: str = ""
    terminated_at: float | None = None  # the simulator's clock: terminated (gone after a linger)
    busy: int = 0
    pages_done: int = 0
    pages_failed: int = 0
    # The document cache, least recently used first (sizes and page counts: the bytes are not kept).
    documents: OrderedDict[str, CachedDocument] = field(default_factory=OrderedDict)
    cached_bytes: int = 0

    @property
    def token(self) -> str:
        return self.env.get("POD_TOKEN", "")

    def cache(self, sha256: str, size: int, pages: int, capacity: int) -> bool:
        """Keep a document (True if it was new), evicting the least recently used ones not in use."""
        if sha256 in self.documents:
            self.documents.move_to_end(sha256)
            return False
        self.documents[sha256] = CachedDocument(size, pages)
        self.cached_bytes += size
        for old in list(self.documents):
            if self.cached_bytes <= capacity:
                break
            entry = self.documents[old]
            if old != sha256 and not entry.in_use:
                del self.documents[old]
                self.cached_bytes -= entry.size
        return True

    def cached(self, sha256: str) -> CachedDocument | None:
        entry = self.documents.get(sha256)
        if entry is not None:
            self.documents.move_to_end(sha256)
        return entry

    @property
    def holds_gpus(self) -> bool:
        return self.started_at is not None


@dataclass
class Verdict:
    """What the HTTP layer should do with one GraphQL call before (or instead of) running it."""

    delay_s: float = 0.0
    delay_after_s: float = 0.0
    status: int = 200
    body: str = "text"
    after_execute: bool = False
    retry_after_s: float | None = None
    error: tuple[str, str | None] | None = None  # a GraphQL error to answer instead of running the call


@dataclass
class Farm:
    config: SimConfig
    clock: Callable[[], float] = time.monotonic
    wall_clock: Callable[[], float] = time.time
    public_port: int = 0
    pods: dict[str, VirtualPod] = field(default_factory=dict)
    stats: Counter[str] = field(default_factory=Counter)

    def __post_init__(self) -> None:
        self.gpus = {gpu.id: gpu for gpu in self.config.gpu_types}
        # Free GPUs per (gpu id, cloud, data centre); a copy, so the config stays as loaded.
        self.free: dict[tuple[str, str, str], int] = {
            (gpu.id, cloud, dc): count
            for gpu in self.config.gpu_types
            for cloud, centres in gpu.capacity.items()
            for dc, count in centres.items()
        }
        self.faults: list[Fault] = list(self.config.faults)
        self.preemptions = random.Random(self.config.preempt_seed)
        self.balance_empty = False  # set through /sim/balance: every pod stopped, creates refused
        self._runtime_null = False  # this call's pod reads show runtime: null (RuntimeNullFault)

    # -- faults and auth ------------------------------------------------------------------------

    def set_faults(self, faults: list[Fault], *, append: bool = False) -> None:
        self.faults = [*self.faults, *faults] if append else list(faults)

    def screen(self, operation: str | None, authorization: str | None) -> Verdict:
        """Apply slow, bad-key and 5xx faults and the key check to one GraphQL call."""
        verdict = Verdict()
        for fault in self.faults:
            if isinstance(fault, SlowFault) and fault.fires(operation):
                if fault.after_execute:
                    verdict.delay_after_s += fault.delay_s
                else:
                    verdict.delay_s += fault.delay_s
        if any(isinstance(f, BadKeyFault) and f.fires(operation) for f in self.faults):
            self.stats["auth_failures"] += 1
            verdict.status = 401
            return verdict
        if authorization != f"Bearer {self.config.api_key}":
            self.stats["auth_failures"] += 1
            verdict.status = 401
            return verdict
        for fault in self.faults:
            if isinstance(fault, RateLimitFault) and fault.fires(operation):
                self.stats["rate_limited"] += 1
                verdict.status, verdict.body, verdict.retry_after_s = 429, fault.body, fault.retry_after_s
                return verdict
            if isinstance(fault, HttpErrorFault) and fault.fires(operation):
                self.stats["http_errors_injected"] += 1
                verdict.status, verdict.body, verdict.after_execute = fault.status, fault.body, fault.after_execute
                return verdict
            if isinstance(fault, ErrorFault) and fault.fires(operation):
                self.stats["errors_injected"] += 1
                verdict.error = (fault.message, fault.code)
                return verdict
        if operation == "podRentInterruptable" and any(
            isinstance(f, UnknownMutationFault) and f.fires(operation) for f in self.faults
        ):
            verdict.error = (
                'Cannot query field "podRentInterruptable" on type "Mutation".',
                "GRAPHQL_VALIDATION_FAILED",
            )
        return verdict

    def proxy_cuts_page(self) -> bool:
        """Whether RunPod's proxy cuts this page request (a ProxyTimeoutFault fires)."""
        if any(isinstance(f, ProxyTimeoutFault) and f.fires() for f in self.faults):
            self.stats["proxy_timeouts_injected"] += 1
            return True
        return False

    def _pod_fault(self, kind: type[BootStuckFault | ModelFailFault]) -> bool:
        return any(isinstance(f, kind) and f.fires("podFindAndDeployOnDemand") for f in self.faults)

    def _blocked(self, gpu: str, cloud: str, dc: str) -> bool:
        return any(isinstance(f, NoCapacityFault) and f.matches(gpu, cloud, dc) for f in self.faults)

    # -- GraphQL ------------------------------------------------------------------------------------

    def count_call(self, operation: graphql.Operation | None) -> None:
        self.stats["graphql_calls"] += 1
        for selected in operation.selections if operation else []:
            self.stats[f"{selected.name}_calls"] += 1
            if selected.name == "gpuTypes":
                self.stats["gputypes_calls"] += 1
                # The unfiltered list is what a price catalogue fetch looks like.
                if not selected.args.get("input"):
                    self.stats["catalogue_calls"] += 1
            elif selected.name in ("podFindAndDeployOnDemand", "podRentInterruptable"):
                self.stats["create_calls"] += 1
                if selected.name == "podRentInterruptable":
                    self.stats["interruptible_create_calls"] += 1
            elif selected.name == "podTerminate":
                self.stats["terminate_calls"] += 1

    def execute(self, operation: graphql.Operation) -> dict[str, Any]:
        """Run a validated operation; GraphQLError becomes the answer's error message."""
        self.preempt_due()
        self.autostop_due()
        self._purge_terminated()
        names = [selected.name for selected in operation.selections]
        self._runtime_null = any(
            isinstance(f, RuntimeNullFault) and any(f.fires(name) for name in names) for f in self.faults
        )
        creates = {"podFindAndDeployOnDemand", "podRentInterruptable"} & set(names)
        if creates and any(isinstance(f, NullResultFault) and f.fires(next(iter(creates))) for f in self.faults):
            self.stats["null_results"] += 1
            return {name: None for name in names}
        resolvers = {
            "gpuTypes": self._gpu_types,
            "myself": self._myself,
            "pod": self._pod,
            "podFindAndDeployOnDemand": self._deploy,
            "podRentInterruptable": self._rent_interruptible,
            "podTerminate": self._terminate,
            "podStop": self._stop,
            "podResume": self._resume,
        }
        root = "Query" if operation.kind == "query" else "Mutation"
        data: dict[str, Any] = {}
        for selected in operation.selections:
            if selected.name == "__typename":
                data[selected.response_key] = root
                continue
            value = resolvers[selected.name](selected.args.get("input") or {})
            child = RUNPOD_SCHEMA.objects[root][selected.name]
            data[selected.response_key] = graphql.project(value, selected.selections, child, RUNPOD_SCHEMA)
        return data

    def _gpu_types(self, filters: dict[str, Any]) -> list[dict[str, Any]]:
        wanted: set[str] | None = None
        if filters.get("id") is not None:
            wanted = {filters["id"]}
        if filters.get("ids") is not None:
            wanted = (wanted or set()) | set(filters["ids"])
        # An unknown id matches nothing, which is how the SDK's get_gpu learns it is unknown.
        return [self._gpu_dict(gpu) for gpu in self.gpus.values() if wanted is None or gpu.id in wanted]

    def _gpu_dict(self, gpu: GpuTypeConfig) -> dict[str, Any]:
        def lowest_price(args: dict[str, Any]) -> dict[str, Any]:
            filters = args.get("input") or {}
            count = filters.get("gpuCount") or 1
            secure = filters.get("secureCloud")
            clouds = ("SECURE", "COMMUNITY") if secure is None else ("SECURE",) if secure else ("COMMUNITY",)
            prices = [gpu.price(c) for c in clouds if gpu.price(c) is not None]
            cheapest = min(prices) * count if prices else None
            stock = sum(n for (gpu_id, cloud, _), n in self.free.items() if gpu_id == gpu.id and cloud in clouds)
            # Without a cloud filter, the lowest of the clouds offered (one figure for both).
            bids = [gpu.minimum_bid(c) for c in clouds if gpu.price(c) is not None]
            bid = min((b for b in bids if b is not None), default=None)
            return {
                "minimumBidPrice": None if bid is None else round(bid * count, 4),
                "uninterruptablePrice": cheapest,
                "minVcpu": 8,
                "minMemory": 32,
                "stockStatus": "High" if stock > 4 else "Low" if stock else None,
            }

        return {
            "id": gpu.id,
            "displayName": gpu.display_name or gpu.id,
            "manufacturer": "Nvidia",
            "memoryInGb": gpu.memory_in_gb,
            "cudaCores": 0,
            "maxGpuCount": gpu.max_gpu_count,
            "secureCloud": gpu.secure_price is not None,
            "communityCloud": gpu.community_price is not None,
            "securePrice": gpu.secure_price,
            "communityPrice": gpu.community_price,
            "oneMonthPrice": None,
            "threeMonthPrice": None,
            "oneWeekPrice": None,
            "secureSpotPrice": None if gpu.secure_price is None else gpu.minimum_bid("SECURE"),
            "communitySpotPrice": None if gpu.community_price is None else gpu.minimum_bid("COMMUNITY"),
            "lowestPrice": lowest_price,
        }

    def _myself(self, _: dict[str, Any]) -> dict[str, Any]:
        return {"id": "sim-user", "pods": [self.pod_dict(pod) for pod in self.pods.values() if self._listed(pod)]}

    def _listed(self, pod: VirtualPod) -> bool:
        """Listing lag: a new pod is listed late; a terminated one stays listed (EXITED) a while; one
        TERMINATED by an outbid leaves the list at once (myself.pods filters terminatedAt)."""
        now, lag = self.clock(), self.config.listing_lag_s
        if pod.desired_status == "TERMINATED" or now < pod.created_at + lag:
            return False
        return pod.terminated_at is None or now < pod.terminated_at + lag

    def _purge_terminated(self) -> None:
        now = self.clock()
        linger = max(self.config.terminated_linger_s, self.config.listing_lag_s)
        for pod_id in [
            p.id for p in self.pods.values() if p.terminated_at is not None and now >= p.terminated_at + linger
        ]:
            del self.pods[pod_id]

    def _pod(self, filters: dict[str, Any]) -> dict[str, Any] | None:
        pod = self.pods.get(filters["podId"])
        return None if pod is None else self.pod_dict(pod)

    def set_balance_empty(self, empty: bool) -> None:
        """The account's balance runs out (every pod stops, "Exited by RunPod: Insufficient balance",
        and creates are refused) or is topped up."""
        self.balance_empty = empty
        if empty:
            for pod in self.pods.values():
                self.stop(pod, "Exited by RunPod: Insufficient balance")

    def _rent_interruptible(self, spec: dict[str, Any]) -> dict[str, Any]:
        gpu = self.gpus.get(spec.get("gpuTypeId") or "")
        bid = spec["bidPerGpu"]
        cloud_type = spec.get("cloudType") or "ALL"
        clouds = ("SECURE", "COMMUNITY") if cloud_type == "ALL" else (cloud_type,)
        # Each cloud's own lowest bid (review row 3); ALL: the lowest of the clouds offered.
        bids = [b for b in (gpu.minimum_bid(c) for c in clouds if gpu.price(c) is not None)] if gpu else []
        minimum = min((b for b in bids if b is not None), default=None)
        if gpu is not None and minimum is None:
            raise graphql.GraphQLError(f"{gpu.id} is not offered as an interruptible pod.")
        if minimum is not None and bid < minimum:
            self.stats["bids_refused"] += 1
            raise graphql.GraphQLError(BID_REFUSED_MESSAGE)
        return self._deploy(spec, bid=bid)

    def rest_create(self, body: dict[str, Any]) -> dict[str, Any]:
        """RunPod's REST create (POST /v1/pods): the GraphQL create's settings in REST's names; an
        interruptible pod is rented at its cloud's lowest bid (REST takes no bid)."""
        gpu_ids = body.get("gpuTypeIds") or []
        spec = {
            "name": body.get("name"),
            "imageName": body.get("imageName"),
            "gpuTypeId": gpu_ids[0] if gpu_ids else None,
            "gpuCount": body.get("gpuCount") or 1,
            "cloudType": body.get("cloudType") or "ALL",
            "dataCenterId": (body.get("dataCenterIds") or [None])[0],
            "ports": ",".join(body.get("ports") or []),
            "env": [{"key": k, "value": v} for k, v in (body.get("env") or {}).items()],
            "containerDiskInGb": body.get("containerDiskInGb"),
            "volumeInGb": body.get("volumeInGb"),
            "volumeMountPath": body.get("volumeMountPath"),
            "networkVolumeId": body.get("networkVolumeId"),
            "containerRegistryAuthId": body.get("containerRegistryAuthId"),
        }
        self.stats["rest_create_calls"] += 1
        self.stats["create_calls"] += 1
        if not body.get("interruptible"):
            return self._deploy(spec)
        gpu = self.gpus.get(spec["gpuTypeId"] or "")
        clouds = ("SECURE", "COMMUNITY") if spec["cloudType"] == "ALL" else (spec["cloudType"],)
        bids = [gpu.minimum_bid(c) for c in clouds if gpu.price(c) is not None] if gpu else []
        bids = [b for b in bids if b is not None]
        if gpu is not None and not bids:
            raise graphql.GraphQLError(f"{gpu.id} is not offered as an interruptible pod.")
        self.stats["interruptible_create_calls"] += 1
        return self._deploy(spec, bid=min(bids) if bids else None)

    def _deploy(self, spec: dict[str, Any], *, bid: float | None = None) -> dict[str, Any]:
        gpu_id = spec.get("gpuTypeId")
        gpu = self.gpus.get(gpu_id or "")
        if gpu is None:
            raise graphql.GraphQLError(f"Unknown GPU type {gpu_id!r}.")
        if not spec.get("imageName") and not spec.get("templateId"):
            raise graphql.GraphQLError("imageName or templateId is required.")
        gpu_count = spec.get("gpuCount") or 1
        price, cloud, dc = self._cheapest_place(spec, gpu, gpu_count)
        cost = round((price if bid is None else bid) * gpu_count, 4)
        if self.balance_empty:
            raise graphql.GraphQLError(INSUFFICIENT_BALANCE_MESSAGE, "INSUFFICIENT_BALANCE")
        limit = self.config.spending_limit_per_hr
        if limit is not None and self.spending_per_hr() + cost > limit + 1e-9:
            self.stats["spending_limit_refusals"] += 1
            raise graphql.GraphQLError(SPENDING_LIMIT_MESSAGE, "INSUFFICIENT_BALANCE")
        image = spec.get("imageName") or ""
        private = any(image.startswith(prefix) for prefix in self.config.private_images)
        pull_refused = private and spec.get("containerRegistryAuthId") not in self.config.registry_auth_ids
        self.free[(gpu.id, cloud, dc)] -= gpu_count
        pod = self._new_pod(spec, gpu, cloud, dc, gpu_count, cost, bid=bid, pull_refused=pull_refused)
        self._plan_exit(pod, pull_refused=pull_refused)
        if bid is not None and self.config.preempt_rate_per_hour > 0:
            pod.preempt_at = pod.started_at + self.preemptions.expovariate(self.config.preempt_rate_per_hour) * 3600
        self.pods[pod.id] = pod
        self.stats["pods_created"] += 1
        return self.pod_dict(pod)

    def _cheapest_place(self, spec: dict[str, Any], gpu: GpuTypeConfig, gpu_count: int) -> tuple[float, str, str]:
        """(price, cloud, data centre) of the cheapest place with ``gpu_count`` GPUs free that the
        spec allows; RunPod's no-capacity error (in one of its wordings) when there is none."""
        cloud_type = spec.get("cloudType") or "ALL"
        clouds = ("SECURE", "COMMUNITY") if cloud_type == "ALL" else (cloud_type,)
        wanted_dc = spec.get("dataCenterId")
        places = [
            (gpu.price(cloud), cloud, dc)
            for (gpu_id_, cloud, dc), free in self.free.items()
            if gpu_id_ == gpu.id
            and cloud in clouds
            and gpu.price(cloud) is not None
            and (wanted_dc is None or dc == wanted_dc)
            and free >= gpu_count
            and not self._blocked(gpu.id, cloud, dc)
        ]
        if not places or gpu_count > gpu.max_gpu_count:
            self.stats["no_capacity_answers"] += 1
            wording = next((f.wording for f in self.faults if isinstance(f, CapacityWordingFault) and f.fires()), None)
            message, code = CAPACITY_WORDINGS[wording or "on_demand"]
            raise graphql.GraphQLError(message, code)
        return min(places, key=lambda place: place[0])

    def _new_pod(
        self,
        spec: dict[str, Any],
        gpu: GpuTypeConfig,
        cloud: str,
        dc: str,
        gpu_count: int,
        cost: float,
        *,
        bid: float | None,
        pull_refused: bool,
    ) -> VirtualPod:
        """The pod the spec asks for, placed, with the faults it draws at creation."""
        env = {item["key"]: item.get("value") or "" for item in spec.get("env") or []}
        now_wall = self.wall_clock()
        pod = VirtualPod(
            id=self._new_id(),
            name=spec.get("name") or "",
            image=spec.get("imageName") or "",
            env=env,
            gpu=gpu,
            cloud=cloud,
            data_center=dc,
            gpu_count=gpu_count,
            cost_per_hr=cost,
            ports=spec.get("ports") or "",
            lanes=gpu.pod_lanes or _lanes(env, self.config.default_lanes),
            created_wall=now_wall,
            started_at=self.clock(),
            status_changed_wall=now_wall,
            stuck=self._pod_fault(BootStuckFault) or pull_refused,
            model_fails=self._pod_fault(ModelFailFault),
            container_disk_in_gb=spec.get("containerDiskInGb"),
            registry_auth_id=spec.get("containerRegistryAuthId") or "",
            volume_in_gb=spec.get("volumeInGb") or 0,
            volume_mount_path=spec.get("volumeMountPath") or "/runpod-volume",
            docker_args=spec.get("dockerArgs") or "",
            network_volume_id=spec.get("networkVolumeId") or "",
            allowed_cuda_versions=list(spec.get("allowedCudaVersions") or []),
            interruptible=bid is not None,
            created_at=self.clock(),
        )
        pod.autostop_s, pod.last_contact = _autostop_seconds(env), pod.started_at
        return pod

    def _plan_exit(self, pod: VirtualPod, *, pull_refused: bool) -> None:
        """When and why a new pod exits on its own, if it does: an image it may not pull, an exit
        fault, a pull that fails at its end (an image fault, never a preemption)."""
        exit_fault = next((f for f in self.faults if isinstance(f, PodExitFault) and f.fires()), None)
        pull = next((f for f in self.faults if isinstance(f, ImagePullFault) and f.fires()), None)
        if pull is not None:  # RUNNING, runtime null, billed, for the pull's minutes
            pod.pull_s = pull.pull_s
            self.stats["image_pulls_failed" if pull.fails else "image_pulls_slow"] += 1
        if pull_refused:  # the image cannot be pulled without the registry's credentials
            pod.exit_at, pod.exit_event = pod.created_at + self.config.boot_delay_s, "Exited by Runpod"
        elif exit_fault is not None:
            pod.stuck = pod.stuck or exit_fault.cause == "image"
            pod.exit_at = pod.created_at + exit_fault.after_s
            pod.exit_event = (
                "Exited by RunPod: Insufficient balance" if exit_fault.cause == "balance" else "Exited by Runpod"
            )
        elif pull is not None and pull.fails:
            pod.stuck = True
            pod.exit_at, pod.exit_event = pod.created_at + pull.pull_s, "Exited by Runpod"

    def _new_id(self) -> str:
        while True:
            pod_id = secrets.token_hex(7)  # RunPod ids are 14 lowercase alphanumerics
            if pod_id not in self.pods:
                return pod_id

    def spending_per_hr(self) -> float:
        return sum(pod.cost_per_hr for pod in self.pods.values() if pod.holds_gpus)

    def _terminate(self, filters: dict[str, Any]) -> None:
        pod = self.pods.get(filters["podId"])
        if pod is None:
            raise graphql.GraphQLError("Pod not found.", "POD_NOT_FOUND")
        if pod.terminated_at is not None:
            return None  # terminated already: RunPod answers the same
        if pod.holds_gpus:
            self.free[(pod.gpu.id, pod.cloud, pod.data_center)] += pod.gpu_count
        self.stats["pods_terminated"] += 1
        if not (self.config.terminated_linger_s or self.config.listing_lag_s):
            del self.pods[pod.id]
            return None
        # RunPod's backend writes EXITED + "Terminated by user" (review row 7); the pod is gone later.
        pod.started_at = pod.preempt_at = pod.exit_at = None
        pod.desired_status, pod.status_event = "EXITED", "Terminated by user"
        pod.status_changed_wall = self.wall_clock()
        pod.terminated_at = self.clock()
        return None

    def _stop(self, filters: dict[str, Any]) -> dict[str, Any]:
        pod = self._existing(filters["podId"])
        if pod.holds_gpus:
            # A stopped RunPod pod gives its GPUs back; resuming may then find none.
            self.free[(pod.gpu.id, pod.cloud, pod.data_center)] += pod.gpu_count
        pod.started_at = None
        pod.preempt_at = None
        pod.desired_status = "EXITED"
        pod.status_event = "Stopped by User"
        pod.status_changed_wall = self.wall_clock()
        return self.pod_dict(pod)

    def _resume(self, args: dict[str, Any]) -> dict[str, Any]:
        pod = self._existing(args["podId"])
        if not pod.holds_gpus:
            key = (pod.gpu.id, pod.cloud, pod.data_center)
            count = args.get("gpuCount") or pod.gpu_count
            if self.free.get(key, 0) < count or self._blocked(*key):
                raise graphql.GraphQLError(NO_GPUS_ON_HOST_MESSAGE)
            self.free[key] -= count
            pod.gpu_count = count
            pod.started_at = self.clock()
            pod.desired_status = "RUNNING"
            pod.status_event = "Resumed by User"
            pod.status_changed_wall = self.wall_clock()
        return self.pod_dict(pod)

    def _existing(self, pod_id: str) -> VirtualPod:
        pod = self.pods.get(pod_id)
        if pod is None:
            raise graphql.GraphQLError("Pod not found.")
        return pod

    # -- preemption ----------------------------------------------------------------------------------

    def preempt_due(self) -> None:
        """Preempt every interruptible pod whose moment has come on the simulator's clock, and stop
        every pod RunPod stops itself (PodExitFault, a private image without its credentials)."""
        now = self.clock()
        for pod in self.pods.values():
            if pod.preempt_at is not None and pod.started_at is not None and now >= pod.preempt_at:
                self.preempt(pod, at=pod.preempt_at)
            if pod.exit_at is not None and now >= pod.exit_at:
                self.stop(pod, pod.exit_event, at=pod.exit_at)

    def stop(self, pod: VirtualPod, event: str, *, at: float | None = None) -> None:
        """RunPod stops the pod (EXITED, its GPUs freed) and writes ``event`` as its status change."""
        pod.exit_at = None
        if pod.started_at is None or pod.terminated_at is not None:
            return
        now = self.clock()
        at = now if at is None else min(at, now)
        self.free[(pod.gpu.id, pod.cloud, pod.data_center)] += pod.gpu_count
        pod.started_at = pod.preempt_at = None
        pod.desired_status, pod.status_event = "EXITED", event
        pod.status_changed_wall = self.wall_clock() - (now - at)
        self.stats["pods_stopped_by_runpod"] += 1

    def preempt(self, pod: VirtualPod, *, at: float | None = None, terminated: bool | None = None) -> None:
        """The provider takes the pod back, as RunPod does an outbid interruptible pod: "Outbid:
        <date>", its GPUs freed for the higher bidder, pages in flight lost. On the EXITED path it
        stays listed until its owner terminates it; on the TERMINATED path (``terminated``, else
        drawn at ``preempt_terminated_share``) it leaves the listing at once (review row 5)."""
        if pod.started_at is None:
            return
        if terminated is None:
            terminated = self.preemptions.random() < self.config.preempt_terminated_share
        now = self.clock()
        at = now if at is None else min(at, now)
        self.free[(pod.gpu.id, pod.cloud, pod.data_center)] += pod.gpu_count
        pod.started_at = None
        pod.preempt_at = None
        pod.preempted = True
        pod.desired_status = "TERMINATED" if terminated else "EXITED"
        pod.status_event = "Outbid"
        pod.status_changed_wall = self.wall_clock() - (now - at)
        if terminated:
            pod.terminated_at = now
        self.stats["pods_preempted"] += 1

    # -- autostop -------------------------------------------------------------------------------------

    def touch(self, pod: VirtualPod) -> None:
        """The control plane asked the pod something with its token: its autostop counts from now."""
        pod.last_contact = self.clock()

    def autostop_due(self) -> None:
        """Stop every pod whose server has been left alone for its autostop interval."""
        for pod in self.pods.values():
            self._autostop_if_due(pod)

    def _autostop_if_due(self, pod: VirtualPod) -> None:
        if pod.autostop_s <= 0 or pod.started_at is None or pod.busy:
            return
        at = max(pod.last_contact, pod.started_at) + pod.autostop_s
        if self.clock() >= at:
            self.exit_container(pod, at=at, event="Exited: the pod server stopped itself (autostop)")
            pod.autostopped = True
            self.stats["pods_autostopped"] += 1

    def exit_container(self, pod: VirtualPod, *, at: float, event: str) -> None:
        """The pod's container exited at ``at`` (the simulator's clock): RunPod marks the pod EXITED
        and stops billing its GPUs; it stays listed until its owner terminates it."""
        if pod.started_at is None:
            return
        now = self.clock()
        self.free[(pod.gpu.id, pod.cloud, pod.data_center)] += pod.gpu_count
        pod.started_at = None
        pod.preempt_at = None
        pod.desired_status = "EXITED"
        pod.status_event = event
        pod.status_changed_wall = self.wall_clock() - max(0.0, now - at)

    # -- pod state ---------------------------------------------------------------------------------

    def runtime_up(self, pod: VirtualPod) -> bool:
        if pod.preempt_at is not None and self.clock() >= pod.preempt_at:
            self.preempt(pod, at=pod.preempt_at)
        self._autostop_if_due(pod)
        return (
            pod.started_at is not None
            and not pod.stuck
            and self.clock() - pod.started_at >= pod.pull_s + self.config.boot_delay_s
        )

    def model_state(self, pod: VirtualPod) -> str:
        assert pod.started_at is not None
        if pod.model_fails:
            return FAILED
        loaded_at = pod.started_at + pod.pull_s + self.config.boot_delay_s + self.config.model_load_s
        return READY if self.clock() >= loaded_at else LOADING

    def pod_dict(self, pod: VirtualPod) -> dict[str, Any]:
        up = self.runtime_up(pod)
        booted = pod.pull_s + self.config.boot_delay_s
        uptime = int(self.clock() - pod.started_at - booted) if up and pod.started_at else 0
        machine_id = f"sim{pod.data_center.lower()}{pod.id[:6]}"
        return {
            "id": pod.id,
            "name": pod.name,
            "containerDiskInGb": pod.container_disk_in_gb,
            "costPerHr": pod.cost_per_hr,
            "desiredStatus": pod.desired_status,
            "dockerArgs": pod.docker_args,
            "dockerId": None,
            "env": [f"{key}={value}" for key, value in pod.env.items()],
            "gpuCount": pod.gpu_count,
            "imageName": pod.image,
            "lastStatusChange": f"{pod.status_event}: {_js_date(pod.status_changed_wall)}",
            "machineId": machine_id,
            "memoryInGb": 62 * pod.gpu_count,
            "podType": "INTERRUPTABLE" if pod.interruptible else "RESERVED",
            "port": None,
            "ports": pod.ports,
            "uptimeSeconds": uptime,
            "vcpuCount": 8 * pod.gpu_count,
            "volumeInGb": pod.volume_in_gb,
            "volumeMountPath": pod.volume_mount_path,
            "runtime": {"uptimeInSeconds": uptime, "ports": self._runtime_ports(pod)}
            if up and not self._runtime_null
            else None,
            "machine": {
                "podHostId": f"{pod.id}-{machine_id[:8]}",
                "gpuDisplayName": pod.gpu.display_name or pod.gpu.id,
                "gpuTypeId": pod.gpu.id,
                "dataCenterId": pod.data_center,
            },
        }

    def serves_http(self, pod: VirtualPod, port: str) -> bool:
        """Whether the pod exposes ``port`` (its number, as a URL names it) over HTTP."""
        return f"{port}/http" in (entry.strip() for entry in pod.ports.split(","))

    def _runtime_ports(self, pod: VirtualPod) -> list[dict[str, Any]]:
        # Every HTTP port of every pod is this process, under its own host ({id}-{port}.proxy.localhost)
        # or /pods/{id}; TCP ports get a plausible mapping that nothing answers.
        ports = []
        for index, entry in enumerate(p for p in pod.ports.split(",") if "/" in p):
            number, _, kind = entry.partition("/")
            if not number.isdigit():
                continue
            http = kind == "http"
            # RunPod gives HTTP ports a private IP (its proxy reaches them) and TCP ports a public
            # ip:port (review row 11); http_ports_public keeps the simulator's kinder answer.
            public = self.config.http_ports_public or not http
            ports.append(
                {
                    "ip": self.config.public_host if public else "10.0.0.2",
                    "isIpPublic": public,
                    "privatePort": int(number),
                    "publicPort": self.public_port if http else 40000 + index,
                    "type": "http" if http else "tcp",
                }
            )
        return ports

    def summary(self) -> dict[str, Any]:
        running = sum(1 for pod in self.pods.values() if self.runtime_up(pod))
        counters = {
            "graphql_calls": 0,
            "create_calls": 0,
            "gputypes_calls": 0,
            "catalogue_calls": 0,
            "terminate_calls": 0,
            "pods_created": 0,
            "pods_terminated": 0,
            "no_capacity_answers": 0,
            "interruptible_create_calls": 0,
            "bids_refused": 0,
            "pods_preempted": 0,
            "pods_autostopped": 0,
            "image_pulls_slow": 0,  # pods that pulled their image for ImagePullFault's minutes
            "image_pulls_failed": 0,  # pods whose pull failed: "Exited by Runpod", not preempted  # pods whose server stopped itself: nobody spoke to them for their interval
            "ocr_pages_lost_to_preemption": 0,  # pages whose pod was preempted while it read them
            "auth_failures": 0,
            "http_errors_injected": 0,
            "proxy_timeouts_injected": 0,  # pages cut by "RunPod's proxy" (524)
            "ocr_pages": 0,
            "ocr_busy_answers": 0,
            "ocr_not_cached_answers": 0,  # 409s: the document was not in the pod's cache
            "pod_auth_failures": 0,  # pod requests with a missing or wrong token
            "documents_received": 0,  # PUTs whose document was new to the pod
            "documents_already_cached": 0,
            "document_bytes_received": 0,  # every PUT body, new or not
            "image_bytes_received": 0,  # raw image bodies of POST /v1/ocr
            "bytes_to_pods": 0,  # both: everything pods were sent to read pages
        }
        counters.update(self.stats)
        return {
            **counters,
            "pods_total": len(self.pods),
            "pods_running": running,
            "pods_billing": sum(1 for pod in self.pods.values() if pod.holds_gpus),
            "pods_booting": sum(1 for pod in self.pods.values() if pod.holds_gpus) - running,
            "free_capacity": sum(self.free.values()),
        }

    def pod_summary(self, pod: VirtualPod) -> dict[str, Any]:
        up = self.runtime_up(pod)
        return {
            "id": pod.id,
            "name": pod.name,
            "gpu": pod.gpu.id,
            "cloud": pod.cloud,
            "data_center": pod.data_center,
            "desired_status": pod.desired_status,
            "runtime_up": up,
            "model": self.model_state(pod) if up else None,
            "lanes": pod.lanes,
            "busy": pod.busy,
            "pages_done": pod.pages_done,
            "cost_per_hr": pod.cost_per_hr,
            "interruptible": pod.interruptible,
            "preempted": pod.preempted,
            "billing": pod.holds_gpus,
            "autostopped": pod.autostopped,
            "create_settings": {  # what create_pod asked for, as tests check it arrived
                "image": pod.image,
                "ports": pod.ports,
                "container_disk_gb": pod.container_disk_in_gb,
                "registry_auth_id": pod.registry_auth_id,
                "volume_gb": pod.volume_in_gb,
                "volume_mount_path": pod.volume_mount_path,
                "network_volume_id": pod.network_volume_id,
                "allowed_cuda_versions": pod.allowed_cuda_versions,
                "docker_args": pod.docker_args,
                "env_names": sorted(pod.env),
            },
            "documents": {"count": len(pod.documents), "bytes": pod.cached_bytes},
        }


def _lanes(env: dict[str, str], default: int) -> int:
    try:
        lanes = int(env.get("LANES", ""))
    except ValueError:
        return default
    return lanes if 1 <= lanes <= 256 else default


def _autostop_seconds(env: dict[str, str]) -> float:
    try:
        seconds = float(env.get("AUTOSTOP_SECONDS", "") or 0)
    except ValueError:
        return 0.0  # the real pod server would refuse to start; the simulator does not judge it
    return max(0.0, seconds)


def _js_date(timestamp: float) -> str:
    """The JavaScript Date.toString() form RunPod puts into lastStatusChange."""
    moment = datetime.fromtimestamp(timestamp, UTC)
    return moment.strftime("%a %b %d %Y %H:%M:%S GMT+0000 (Coordinated Universal Time)")
