from __future__ import annotations

from pods.providers.base import Provider


def get_provider(name: str) -> Provider:
    if name == "local":
        from pods.providers.local import LocalProvider

        return LocalProvider()
    if name == "runpod":
        from pods.providers.runpod import RunPodProvider

        return RunPodProvider()
    raise ValueError(f"unknown provider {name!r}")
