"""Latency of URLs measured from outside, open-loop, at a fixed rate.

    python tools/loadprobe.py --rate 20 --seconds 30 --header "Authorization: Bearer fa_..." \\
        http://127.0.0.1:8000/healthz http://127.0.0.1:8000/v1/runpod/status

Each URL gets ``--rate`` requests per second for ``--seconds`` seconds, sent on
schedule whether or not earlier ones have answered (open loop: a server that
stalls collects unanswered requests instead of slowing the probe down). URLs are
phase-shifted so that they are not all asked at the same instant. A request that
has no complete answer within ``--timeout`` seconds, or whose connection fails,
is counted as unanswered; an answer outside 2xx is counted as non-2xx.

Latency is from the moment the request is started to the last byte of the
body. How late the probe itself started requests (its own loop lag) is reported
as ``send_lag_max_ms``: if that is large, the machine running the probe was busy
and the figures include some of it.

Prints per URL: count, p50, p90, p99, max (ms, answered requests), unanswered,
non-2xx; then one JSON line. Importable::

    from tools.loadprobe import probe
    figures = await probe(urls, rate=20, seconds=30, headers={"Authorization": "Bearer ..."}, request_timeout=5)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import time
from collections import Counter
from typing import Protocol

import aiohttp


class Stop(Protocol):
    def is_set(self) -> bool: ...


def percentile(values: list[float], p: float) -> float | None:
    """Nearest-rank percentile of sorted ``values`` (None when empty)."""
    if not values:
        return None
    rank = max(1, math.ceil(p / 100 * len(values)))
    return values[min(rank, len(values)) - 1]


class _Tally:
    def __init__(self) -> None:
        self.sent = 0
        self.latencies: list[float] = []
        self.timeouts = 0
        self.errors = 0
        self.non_2xx = 0
        self.statuses: Counter[int] = Counter()
        self.error_kinds: Counter[str] = Counter()

    def figures(self) -> dict:
        answered = sorted(self.latencies)

        def ms(value: float | None) -> float | None:
            return None if value is None else round(value * 1000, 2)

        return {
            "count": self.sent,
            "answered": len(answered),
            "p50_ms": ms(percentile(answered, 50)),
            "p90_ms": ms(percentile(answered, 90)),
            "p99_ms": ms(percentile(answered, 99)),
            "max_ms": ms(answered[-1] if answered else None),
            "unanswered": self.timeouts + self.errors,
            "timeouts": self.timeouts,
            "connection_errors": self.errors,
            "non_2xx": self.non_2xx,
            "statuses": {str(status): n for status, n in sorted(self.statuses.items())},
            "error_kinds": dict(self.error_kinds),
        }


async def _one(
    session: aiohttp.ClientSession, url: str, headers: dict[str, str], request_timeout: float, tally: _Tally
):
    started = time.perf_counter()
    try:
        async with asyncio.timeout(request_timeout):
            async with session.get(url, headers=headers, allow_redirects=False) as response:
                await response.read()
                status = response.status
    except TimeoutError:
        tally.timeouts += 1
        return
    except (aiohttp.ClientError, OSError) as exc:
        tally.errors += 1
        tally.error_kinds[type(exc).__name__] += 1
        return
    tally.latencies.append(time.perf_counter() - started)
    tally.statuses[status] += 1
    if not 200 <= status < 300:
        tally.non_2xx += 1


async def probe(
    urls: list[str],
    rate: float,
    seconds: float,
    headers: dict[str, str] | None = None,
    request_timeout: float = 5.0,
    *,
    stop: Stop | None = None,
) -> dict:
    """Send ``rate`` GETs per second to each URL for ``seconds`` seconds (open loop) and
    wait for the last answers (at most ``request_timeout`` more: each request gets that long).
    ``stop`` (anything with ``is_set()``, e.g. a threading.Event) ends the sending early.

    Returns ``{"rate", "seconds", "timeout", "elapsed_s", "send_lag_max_ms", "urls": {url: figures}}``
    ("timeout" is ``request_timeout``, the name ``--timeout`` and earlier results use)
    where figures are count, answered, p50_ms, p90_ms, p99_ms, max_ms, unanswered
    (timeouts + connection errors), non_2xx, statuses.
    """
    if rate <= 0 or seconds <= 0:
        raise ValueError("rate and seconds must be positive")
    headers = dict(headers or {})
    tallies = {url: _Tally() for url in urls}
    lags: list[float] = []
    tasks: set[asyncio.Task] = set()
    total = int(round(rate * seconds))
    interval = 1.0 / rate
    loop = asyncio.get_running_loop()
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    began = time.perf_counter()
    async with aiohttp.ClientSession(connector=connector) as session:
        start = loop.time() + 0.05

        async def schedule(index: int, url: str) -> None:
            offset = index * interval / max(1, len(urls))
            tally = tallies[url]
            for n in range(total):
                due = start + offset + n * interval
                delay = due - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                if stop is not None and stop.is_set():
                    return
                lags.append(max(0.0, loop.time() - due))
                tally.sent += 1
                task = asyncio.ensure_future(_one(session, url, headers, request_timeout, tally))
                tasks.add(task)
                task.add_done_callback(tasks.discard)

        await asyncio.gather(*(schedule(i, url) for i, url in enumerate(urls)))
        if tasks:
            await asyncio.wait(list(tasks))
    return {
        "rate": rate,
        "seconds": seconds,
        "timeout": request_timeout,
        "elapsed_s": round(time.perf_counter() - began, 2),
        "send_lag_max_ms": round(max(lags, default=0.0) * 1000, 2),
        "urls": {url: tally.figures() for url, tally in tallies.items()},
    }


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def report_lines(figures: dict) -> list[str]:
    """The human-readable table for ``probe``'s result."""
    width = max([len("url"), *(len(url) for url in figures["urls"])])
    lines = [
        f"{'url':<{width}}  {'count':>6} {'p50':>8} {'p90':>8} {'p99':>8} {'max':>8}  {'unanswered':>10} {'non-2xx':>7}"
    ]
    for url, row in figures["urls"].items():
        lines.append(
            f"{url:<{width}}  {row['count']:>6} {_fmt(row['p50_ms']):>8} {_fmt(row['p90_ms']):>8} "
            f"{_fmt(row['p99_ms']):>8} {_fmt(row['max_ms']):>8}  {row['unanswered']:>10} {row['non_2xx']:>7}"
        )
    lines.append(f"(latencies in ms over answered requests; probe send lag max {figures['send_lag_max_ms']} ms)")
    return lines


def _header(text: str) -> tuple[str, str]:
    name, sep, value = text.partition(":")
    if not sep or not name.strip():
        raise argparse.ArgumentTypeError(f"a header looks like 'Name: value', not {text!r}")
    return name.strip(), value.strip()


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description="Open-loop latency probe: a fixed rate of GETs per URL.")
    parser.add_argument("urls", nargs="+", metavar="URL")
    parser.add_argument("--rate", type=float, default=20.0, help="requests per second per URL (default 20)")
    parser.add_argument("--seconds", type=float, default=30.0, help="how long to send (default 30)")
    parser.add_argument("--timeout", type=float, default=5.0, help="a request unanswered this long counts as such")
    parser.add_argument("--header", type=_header, action="append", default=[], help="'Name: value', repeatable")
    args = parser.parse_args(argv)
    if args.rate <= 0 or args.seconds <= 0 or args.timeout <= 0:
        parser.error("--rate, --seconds and --timeout must be positive")
    figures = asyncio.run(probe(args.urls, args.rate, args.seconds, dict(args.header), args.timeout))
    print(f"loadprobe: {args.rate:g}/s per URL for {args.seconds:g} s, timeout {args.timeout:g} s")
    for line in report_lines(figures):
        print(line)
    print(json.dumps({"tool": "loadprobe", **figures}))
    return figures


if __name__ == "__main__":
    main(sys.argv[1:])
