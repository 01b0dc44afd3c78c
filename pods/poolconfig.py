"""A pool's provider settings: the candidates a boot walks, the image, ports, env and the rest
of RunPod's create settings (disk, volumes, CUDA versions, docker args)."""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from pods.providers.base import Offer, PodOptions, PodSpec
from pods.providers.local import LOCAL_OFFER


class CandidateGroup(BaseModel):
    model_config = ConfigDict(extra="forbid")

    gpu_types: list[str] = Field(min_length=1)
    cloud_type: Literal["SECURE", "COMMUNITY"] = "SECURE"
    data_centers: list[str] = Field(default_factory=list, description="empty: any data centre")
    interruptible: bool = Field(False, description="rent these as interruptible (spot) pods, at a bid")
    # The bid: the catalogue's minimum bid plus this margin ($/h per GPU), capped at the on-demand price.
    bid_margin: Decimal = Field(Decimal("0.01"), ge=0, le=100, max_digits=8, decimal_places=4)


class RunPodPoolConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    image: str = Field(min_length=1)
    ports: str = "8000/http"
    env: dict[str, str] = Field(default_factory=dict)
    candidates: list[CandidateGroup] = Field(min_length=1)
    # RunPod's create_pod settings; each is checked again where the SDK call is built.
    container_disk_gb: int | None = Field(None, ge=1, le=4096)
    volume_gb: int = Field(0, ge=0, le=16384)
    volume_mount_path: str = Field("/runpod-volume", pattern=r"^/[A-Za-z0-9._/-]{0,200}$")
    network_volume_id: str = Field("", pattern=r"^[A-Za-z0-9]{0,64}$")
    # RunPod's id of the saved registry credentials a private image is pulled with: the create must
    # name it (credentials saved in RunPod's settings alone do not reach the pod's image pull).
    registry_auth_id: str = Field("", pattern=r"^[A-Za-z0-9_-]{0,64}$")
    allowed_cuda_versions: list[str] = Field(default_factory=list, max_length=20)
    docker_args: str = Field("", max_length=2000)
    ssh: bool = Field(False, description="start RunPod's SSH service in each pod")
    public_ip: bool = Field(False, description="give each pod a public IP (needed when pods are reached by IP)")
    # Interruptible candidates are skipped while fewer than this many on-demand pods are alive.
    on_demand_floor: int = Field(0, ge=0, le=10000)
    # A candidate whose interruptible pod was preempted is skipped by every boot this long.
    preempted_skip_seconds: float = Field(600.0, ge=0, le=86400)
    # The scaler and the forecast count the pool's preemptions over its last this many hours.
    preemption_window_hours: float = Field(6.0, gt=0, le=24 * 30)

    @field_validator("allowed_cuda_versions")
    @classmethod
    def _cuda_versions(cls, versions: list[str]) -> list[str]:
        for version in versions:
            if not re.fullmatch(r"\d{1,2}\.\d{1,2}", version):
                raise ValueError(f"a CUDA version looks like 12.4, not {version!r}")
        return versions

    def pod_options(self) -> PodOptions:
        return PodOptions(
            container_disk_gb=self.container_disk_gb,
            volume_gb=self.volume_gb,
            volume_mount_path=self.volume_mount_path,
            network_volume_id=self.network_volume_id,
            registry_auth_id=self.registry_auth_id,
            allowed_cuda_versions=tuple(self.allowed_cuda_versions),
            docker_args=self.docker_args,
            ssh=self.ssh,
            public_ip=self.public_ip,
        )

    @property
    def has_interruptible(self) -> bool:
        return any(group.interruptible for group in self.candidates)

    def offers(self) -> list[Offer]:
        """Every (GPU type, cloud, data centre) the pool may boot on, in the order written."""
        seen: dict[str, Offer] = {}
        for group in self.candidates:
            for gpu in group.gpu_types:
                for data_center in group.data_centers or [""]:
                    offer = Offer(
                        gpu_type=gpu,
                        cloud_type=group.cloud_type,
                        data_center=data_center,
                        interruptible=group.interruptible,
                        bid_margin=group.bid_margin if group.interruptible else Decimal("0"),
                    )
                    seen.setdefault(offer.key, offer)
        return list(seen.values())


# What a local pool may set of its pods' environment: the pod server's own knobs, so that two
# local pools run different engines (the cascade: tesseract first, rapidocr as the escalation).
# Everything else a local pod gets is the worker's allowed environment (pods/providers/local.py).
LOCAL_ENV_NAMES = frozenset({"ENGINE", "MODEL", "DEVICE", "RAPIDOCR_THREADS", "TESSERACT_API"})


class LocalPoolConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    env: dict[str, str] = Field(default_factory=dict)

    @field_validator("env")
    @classmethod
    def _env(cls, env: dict[str, str]) -> dict[str, str]:
        for name, value in env.items():
            if name not in LOCAL_ENV_NAMES:
                raise ValueError(f"a local pool sets only {', '.join(sorted(LOCAL_ENV_NAMES))}, not {name!r}")
            if not re.fullmatch(r"[A-Za-z0-9._:/-]{0,200}", value):
                raise ValueError(f"{name}: letters, digits and ._:/- only")
        return env


class PoolConfigError(ValueError):
    pass


def _validate(model: type[BaseModel], config: dict) -> BaseModel:
    try:
        return model.model_validate(config or {})
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "config"
        raise PoolConfigError(f"{where}: {first['msg']}") from None


def parse_config(provider: str, config: dict) -> RunPodPoolConfig | None:
    """The pool's config, checked; None for providers without candidates (a local pool's config is
    only its pods' engine settings: ``local_pod_env``)."""
    if provider == "local":
        _validate(LocalPoolConfig, config)
        return None
    if provider != "runpod":
        if config:
            raise PoolConfigError(f"the {provider} provider takes no config; leave it empty")
        return None
    parsed = _validate(RunPodPoolConfig, config)
    # Refuse now what the SDK could not send safely, rather than at the first boot.
    # function-level: the runpod SDK is imported only where a RunPod pool is configured
    from pods.providers.runpod import create_arguments

    for offer in parsed.offers():
        spec = PodSpec(
            name="fa-check",
            lanes=1,
            offer=offer,
            image=parsed.image,
            ports=parsed.ports,
            env=parsed.env,
            options=parsed.pod_options(),
        )
        try:
            create_arguments(spec)
        except ValueError as exc:
            raise PoolConfigError(str(exc)) from None
        except Exception as exc:  # UnknownOffer for a bad cloud type
            raise PoolConfigError(str(exc)) from None
    return parsed


def pool_offers(pool) -> tuple[list[Offer], RunPodPoolConfig | None]:
    config = parse_config(pool.provider, pool.config)
    if config is None:
        return [LOCAL_OFFER], None
    return config.offers(), config


def local_pod_env(pool) -> dict[str, str]:
    """What a local pool sets of its pods' environment (its engine); {} for any other pool."""
    if pool.provider != "local":
        return {}
    return dict(_validate(LocalPoolConfig, pool.config).env)
