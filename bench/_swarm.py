"""Clients that hold the front's connections: the harness of bench/hostile.py and bench/slow_bodies.py."""

from __future__ import annotations

import asyncio
import threading


class ClientSwarm:
    """``count`` clients on an event loop of a thread of their own, started a few milliseconds apart,
    each connecting again a second after its last connection ended, until ``close``. A subclass
    gives ``_one(n)``, one connection of client ``n``, and ``_reset(n)``, which counts one that
    could not connect or was reset (OSError)."""

    STAGGER_SECONDS = 0.01  # not all in the same instant

    def __init__(self, host: str, port: int, count: int):
        self.host, self.port, self.count = host, port, count
        self.stop = threading.Event()
        self.thread = threading.Thread(target=lambda: asyncio.run(self._all()), daemon=True)

    def start(self) -> None:
        self.thread.start()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(15)

    async def _all(self) -> None:
        await asyncio.gather(*(self._client(n) for n in range(self.count)))

    async def _client(self, n: int) -> None:
        await asyncio.sleep(n * self.STAGGER_SECONDS)
        while not self.stop.is_set():
            try:
                await self._one(n)
            except OSError:
                self._reset(n)
            if not self.stop.is_set():
                await asyncio.sleep(1.0)

    async def _one(self, n: int) -> None:
        raise NotImplementedError

    def _reset(self, n: int) -> None:
        raise NotImplementedError


def status_of(answer: bytes, otherwise: str) -> str:
    """The status code of an HTTP answer's first bytes, or ``otherwise`` when they are not one."""
    return answer.split(b" ", 2)[1].decode(errors="replace") if answer.startswith(b"HTTP/") else otherwise
