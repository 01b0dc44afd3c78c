from __future__ import annotations

from pods.providers.base import Provider


def get_provider(name: str) -> Provider:
    if name == "local":
        # function-level: only the provider in use is loaded
        from pods.providers.local import LocalProvider

        return LocalProvider()
    if name == "runpod":
        # function-level: the runpod SDK only where a RunPod pool is used
        from pods.providers.runpod import RunPodProvider

        return RunPodProvider()
    raise ValueError(f"unknown provider {name!r}")
