"""Start the simulator on the running event loop (the management command) or in a thread (tests)."""

from __future__ import annotations

import asyncio
import signal
import ssl
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx
from aiohttp import web

from runpodsim.app import FARM_KEY, POD_DOMAIN, make_app
from runpodsim.config import SimConfig

START_GUARD_S = 30.0


def pod_url_template(url: str, *, gateway: bool = False) -> str:
    """The ``RUNPOD_POD_URL_TEMPLATE`` of the simulator at ``url``: each pod under a host of its own,
    ``{pod_id}-{port}.proxy.localhost`` at the simulator's port, as RunPod's proxy serves
    ``{pod_id}-{port}.proxy.runpod.net`` (names under .localhost are loopback: fleetadmin/localhost.py);
    or (``gateway``) every pod under ``/pods/{pod_id}`` of the one host."""
    if gateway:
        return f"{url}/pods/{{pod_id}}"
    return f"http://{{pod_id}}-{{port}}.{POD_DOMAIN}:{urlsplit(url).port}"


@dataclass(frozen=True)
class Endpoint:
    """Where a started simulator listens, and the settings that point fleetadmin at it."""

    host: str
    port: int
    api_key: str
    tls_port: int | None = None  # a second listener over TLS (the same pods), when asked for
    gateway: bool = False  # the template it announces: every pod under /pods/{pod_id} (SimConfig.gateway)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def pod_url_template(self) -> str:
        return pod_url_template(self.url, gateway=self.gateway)

    def environment(self) -> dict[str, str]:
        return {
            "RUNPOD_API_BASE_URL": self.url,
            "RUNPOD_API_KEY": self.api_key,
            "RUNPOD_POD_URL_TEMPLATE": self.pod_url_template,
        }


async def start(
    config: SimConfig,
    host: str = "127.0.0.1",
    port: int = 0,
    shutdown_timeout: float = 5.0,
    tls: ssl.SSLContext | None = None,
) -> tuple[web.AppRunner, Endpoint]:
    """Serve ``config`` at ``host:port``; with ``tls`` (a server context), over TLS too on a port of
    its own, as RunPod's proxy serves pods (``Endpoint.tls_port``)."""
    app = make_app(config)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=shutdown_timeout)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    bound_port = runner.addresses[0][1]
    app[FARM_KEY].public_port = bound_port
    tls_port = None
    if tls is not None:
        site = web.TCPSite(runner, host, 0, ssl_context=tls)
        await site.start()
        tls_port = site._server.sockets[0].getsockname()[1]
    return runner, Endpoint(config.public_host, bound_port, config.api_key, tls_port, gateway=config.gateway)


async def serve(
    config: SimConfig, host: str, port: int, announce: Callable[[Endpoint], None] = lambda endpoint: None
) -> None:
    """Serve until SIGINT or SIGTERM."""
    runner, endpoint = await start(config, host, port)
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stopping.set)
    try:
        announce(endpoint)
        await stopping.wait()
    finally:
        await runner.cleanup()


class SimulatorThread:
    """The simulator on its own event loop in a daemon thread, reached over real HTTP.

    Tests talk to it only through HTTP (the SDK, the pods, the /sim control API),
    so nothing here shares state across threads.
    """

    def __init__(
        self, config: SimConfig | None = None, host: str = "127.0.0.1", port: int = 0, tls: ssl.SSLContext | None = None
    ) -> None:
        self.config = config or SimConfig()
        self.tls = tls
        self.host = host
        self.port = port
        self.endpoint: Endpoint | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> SimulatorThread:
        ready = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            try:
                runner, self.endpoint = loop.run_until_complete(
                    start(self.config, self.host, self.port, shutdown_timeout=1.0, tls=self.tls)
                )
            except BaseException as exc:
                failure.append(exc)
                loop.close()
                ready.set()
                return
            ready.set()
            try:
                loop.run_forever()
            finally:
                loop.run_until_complete(runner.cleanup())
                loop.close()

        self._thread = threading.Thread(target=run, name="runpodsim", daemon=True)
        self._thread.start()
        if not ready.wait(START_GUARD_S):
            raise RuntimeError("the RunPod simulator did not start")
        if failure:
            raise failure[0]
        return self

    def stop(self) -> None:
        if self._loop is not None and self._thread is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=START_GUARD_S)

    def __enter__(self) -> SimulatorThread:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        assert self.endpoint is not None, "start() the simulator first"
        return self.endpoint.url

    @property
    def pod_url_template(self) -> str:
        assert self.endpoint is not None, "start() the simulator first"
        return self.endpoint.pod_url_template

    # Control API helpers (blocking; for tests and benchmarks, never on an event loop).

    def stats(self) -> dict[str, Any]:
        return httpx.get(f"{self.url}/sim/stats", timeout=10).raise_for_status().json()

    def pods(self) -> list[dict[str, Any]]:
        return httpx.get(f"{self.url}/sim/pods", timeout=10).raise_for_status().json()["pods"]

    def pod_documents(self, provider_id: str) -> list[dict[str, Any]]:
        """What the virtual pod's document cache holds: sha256, bytes, pages."""
        answer = httpx.get(f"{self.url}/sim/pods/{provider_id}/documents", timeout=10)
        return answer.raise_for_status().json()["documents"]

    def set_faults(self, faults: list[dict[str, Any]], *, append: bool = False) -> list[dict[str, Any]]:
        answer = httpx.post(f"{self.url}/sim/faults", json={"faults": faults, "append": append}, timeout=10)
        return answer.raise_for_status().json()["faults"]

    def preempt(self, provider_id: str, *, terminated: bool = False) -> dict[str, Any]:
        """The provider takes an interruptible pod back now (``terminated``: on the TERMINATED path)."""
        payload = {"pod_id": provider_id, "terminated": terminated}
        return httpx.post(f"{self.url}/sim/preempt", json=payload, timeout=10).raise_for_status().json()

    def stop_by_runpod(self, provider_id: str, *, cause: str = "host") -> dict[str, Any]:
        """RunPod stops a pod itself: "Exited by Runpod" (host, image) or for the balance."""
        payload = {"pod_id": provider_id, "cause": cause}
        return httpx.post(f"{self.url}/sim/stop", json=payload, timeout=10).raise_for_status().json()

    def set_balance_empty(self, empty: bool) -> None:
        httpx.post(f"{self.url}/sim/balance", json={"empty": empty}, timeout=10).raise_for_status()

    def set_capacity(self, gpu: str, cloud: str, data_center: str, free: int) -> None:
        payload = {"gpu": gpu, "cloud": cloud, "data_center": data_center, "free": free}
        httpx.post(f"{self.url}/sim/capacity", json=payload, timeout=10).raise_for_status()
