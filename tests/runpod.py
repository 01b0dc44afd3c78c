"""Pointing the RunPod provider at a simulator in a test."""

from __future__ import annotations

import httpx

from fleetadmin.localhost import localhost_transport


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


def pod_client(**options) -> httpx.Client:
    """An httpx client (``options``) that reaches a simulated pod at its own host, ``{pod_id}-{port}
    .proxy.localhost``: names under .localhost on loopback, as the control plane's clients have them."""
    options.setdefault("timeout", 10)
    return httpx.Client(transport=localhost_transport(), **options)


def pod_request(method: str, url: str, **options) -> httpx.Response:
    """One request to a simulated pod at its own host (``pod_client``)."""
    with pod_client() as client:
        return client.request(method, url, **options)
