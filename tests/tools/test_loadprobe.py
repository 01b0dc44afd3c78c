"""tools/loadprobe.py against a tiny local aiohttp server: answers are counted, a route
that never answers is counted unanswered, errors are non-2xx. No timing assertions."""

from __future__ import annotations

import asyncio
import json

from aiohttp import web

from pods.providers.local import free_port
from tools.loadprobe import main, percentile, probe


async def _serve(release: asyncio.Event, seen_headers: list[str]) -> tuple[web.AppRunner, str]:
    async def fast(request: web.Request) -> web.Response:
        seen_headers.append(request.headers.get("Authorization", ""))
        return web.json_response({"status": "ok"})

    async def never(request: web.Request) -> web.Response:
        await release.wait()  # holds the request until the test is over
        return web.json_response({})

    async def broken(request: web.Request) -> web.Response:
        return web.json_response({"error": "no"}, status=503)

    app = web.Application()
    app.add_routes([web.get("/fast", fast), web.get("/never", never), web.get("/broken", broken)])
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    return runner, f"http://127.0.0.1:{port}"


def test_probe_counts_answers_unanswered_and_non_2xx():
    seen: list[str] = []

    async def scenario() -> dict:
        release = asyncio.Event()
        runner, base = await _serve(release, seen)
        try:
            refused = f"http://127.0.0.1:{free_port()}/healthz"
            urls = [f"{base}/fast", f"{base}/never", f"{base}/broken", refused]
            return await probe(urls, rate=20, seconds=0.5, headers={"Authorization": "Bearer t0k"}, request_timeout=0.5)
        finally:
            release.set()
            await runner.cleanup()

    figures = asyncio.run(scenario())
    fast, never, broken, refused = figures["urls"].values()
    assert fast["count"] == 10 and fast["answered"] == 10
    assert fast["unanswered"] == 0 and fast["non_2xx"] == 0
    assert fast["p50_ms"] is not None and fast["p50_ms"] <= fast["p90_ms"] <= fast["p99_ms"] <= fast["max_ms"]
    assert set(seen) == {"Bearer t0k"}
    assert never["count"] == 10 and never["answered"] == 0
    assert never["unanswered"] == 10 and never["timeouts"] == 10
    assert never["p99_ms"] is None
    assert broken["answered"] == 10 and broken["non_2xx"] == 10 and broken["statuses"] == {"503": 10}
    assert broken["unanswered"] == 0
    assert refused["unanswered"] == 10 and refused["connection_errors"] == 10


def test_stop_ends_the_sending_early():
    class Stopped:
        def is_set(self) -> bool:
            return True

    async def scenario() -> dict:
        runner, base = await _serve(asyncio.Event(), [])
        try:
            return await probe([f"{base}/fast"], rate=50, seconds=60, request_timeout=1, stop=Stopped())
        finally:
            await runner.cleanup()

    figures = asyncio.run(scenario())
    assert figures["urls"][next(iter(figures["urls"]))]["count"] == 0


def test_percentile_is_nearest_rank():
    values = [float(n) for n in range(1, 101)]
    assert percentile(values, 50) == 50.0
    assert percentile(values, 99) == 99.0
    assert percentile(values, 100) == 100.0
    assert percentile([7.0], 99) == 7.0
    assert percentile([], 50) is None


def test_command_line_prints_a_table_and_ends_with_one_json_line(capsys):
    refused = f"http://127.0.0.1:{free_port()}/x"
    main(["--rate", "10", "--seconds", "0.3", "--timeout", "0.5", "--header", "Authorization: Bearer abc", refused])
    out = capsys.readouterr().out.strip().splitlines()
    last = json.loads(out[-1])
    assert last["tool"] == "loadprobe"
    assert last["urls"][refused]["count"] == 3 and last["urls"][refused]["unanswered"] == 3
    assert any(refused in line for line in out[:-1])
    assert "abc" not in "\n".join(out)  # the token is not printed
