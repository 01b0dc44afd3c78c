"""Pointing the RunPod provider at a simulator in a test."""

from __future__ import annotations


def use_simulator(sim, monkeypatch, settings, *, api_key: str | None = None) -> None:
    """The SDK reads ``RUNPOD_API_BASE_URL`` from the environment on every call. The
    provider's key and pod URL template are settings, read from the environment at start:
    set in both, for this process and for the processes the test starts."""
    monkeypatch.setenv("RUNPOD_API_BASE_URL", sim.url)
    monkeypatch.setenv("RUNPOD_POD_URL_TEMPLATE", sim.pod_url_template)
    settings.RUNPOD_POD_URL_TEMPLATE = sim.pod_url_template
    if api_key is not None:
        monkeypatch.setenv("RUNPOD_API_KEY", api_key)
        settings.RUNPOD_API_KEY = api_key
