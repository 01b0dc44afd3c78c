from __future__ import annotations

from pods.providers.base import Provider


def get_provider(name: str) -> Provider:
    if name == "local":
        from pods.providers.local import LocalProvider

        return LocalProvider()
    raise ValueError(f"unknown provider {name!r}")
