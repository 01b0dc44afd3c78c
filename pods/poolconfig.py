"""A pool's provider settings: the candidates a boot walks, the image, ports and env."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from pods.providers.base import Offer, PodSpec
from pods.providers.local import LOCAL_OFFER


class CandidateGroup(BaseModel):
    model_config = ConfigDict(extra="forbid")

    gpu_types: list[str] = Field(min_length=1)
    cloud_type: Literal["SECURE", "COMMUNITY"] = "SECURE"
    data_centers: list[str] = Field(default_factory=list, description="empty: any data centre")


class RunPodPoolConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    image: str = Field(min_length=1)
    ports: str = "8000/http"
    env: dict[str, str] = Field(default_factory=dict)
    candidates: list[CandidateGroup] = Field(min_length=1)

    def offers(self) -> list[Offer]:
        """Every (GPU type, cloud, data centre) the pool may boot on, in the order written."""
        seen: dict[str, Offer] = {}
        for group in self.candidates:
            for gpu in group.gpu_types:
                for data_center in group.data_centers or [""]:
                    offer = Offer(gpu_type=gpu, cloud_type=group.cloud_type, data_center=data_center)
                    seen.setdefault(offer.key, offer)
        return list(seen.values())


class PoolConfigError(ValueError):
    pass


def parse_config(provider: str, config: dict) -> RunPodPoolConfig | None:
    """The pool's config, checked; None for providers that take none."""
    if provider != "runpod":
        if config:
            raise PoolConfigError(f"the {provider} provider takes no config; leave it empty")
        return None
    try:
        parsed = RunPodPoolConfig.model_validate(config or {})
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "config"
        raise PoolConfigError(f"{where}: {first['msg']}") from None
    # Refuse now what the SDK could not send safely, rather than at the first boot.
    from pods.providers.runpod import create_arguments

    for offer in parsed.offers():
        spec = PodSpec(name="fa-check", lanes=1, offer=offer, image=parsed.image, ports=parsed.ports, env=parsed.env)
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
