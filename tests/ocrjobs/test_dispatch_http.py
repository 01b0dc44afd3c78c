"""The dispatcher's keep-alive client for pages' POSTs to plain-HTTP pods (ocrjobs/dispatch/http.py),
against a real aiohttp server on a local port."""

from __future__ import annotations

import asyncio
import socket

import pytest
from aiohttp import web

from ocrjobs.dispatch.http import PodClient, PodDisconnected, PodRefused

GUARD = 20


def run(scenario):
    return asyncio.run(asyncio.wait_for(scenario(), GUARD))


async def serve(handler) -> tuple[web.AppRunner, str, list]:
    """A server whose /v1/ocr is ``handler``; its base URL; the peers (client ports) it saw, in order."""
    peers: list = []

    async def ocr(request):
        peers.append(request.transport.get_extra_info("peername")[1])
        return await handler(request)

    app = web.Application()
    app.router.add_post("/v1/ocr", ocr)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    return runner, f"http://127.0.0.1:{port}", peers


def client(timeout: float = 5.0) -> PodClient:
    return PodClient(timeout=timeout, connect_timeout=2.0)


def test_a_post_carries_the_token_and_body_and_gets_status_and_body_on_one_kept_connection():
    seen = []

    async def handler(request):
        seen.append((request.headers.get("Authorization"), request.content_type, await request.read()))
        return web.json_response({"text": "hi"}, status=201)

    async def scenario():
        runner, url, peers = await serve(handler)
        pods = client()
        try:
            answers = [await pods.post(url, "/v1/ocr", b'{"page": %d}' % n, token="tok") for n in (1, 2, 3)]
        finally:
            pods.close()
            await runner.cleanup()
        return answers, peers

    answers, peers = run(scenario)
    assert answers == [(201, b'{"text": "hi"}')] * 3
    assert seen == [("Bearer tok", "application/json", b'{"page": %d}' % n) for n in (1, 2, 3)]
    assert len(set(peers)) == 1, "one connection, kept alive"


def test_many_posts_in_flight_each_get_their_own_answer():
    async def handler(request):
        body = await request.read()
        await asyncio.sleep(0.01)
        return web.Response(body=body[::-1])

    async def scenario():
        runner, url, _ = await serve(handler)
        pods = client()
        try:
            return await asyncio.gather(*(pods.post(url, "/v1/ocr", b"page-%03d" % n) for n in range(100)))
        finally:
            pods.close()
            await runner.cleanup()

    assert run(scenario) == [(200, (b"page-%03d" % n)[::-1]) for n in range(100)]


def test_a_chunked_answer_is_read_whole_and_the_connection_is_kept():
    async def handler(request):
        response = web.StreamResponse(status=504)
        response.enable_chunked_encoding()
        await response.prepare(request)
        for part in (b'{"error": ', b'"too slow"', b"}"):
            await response.write(part)
        await response.write_eof()
        return response

    async def scenario():
        runner, url, peers = await serve(handler)
        pods = client()
        try:
            return [await pods.post(url, "/v1/ocr", b"{}") for _ in range(2)], peers
        finally:
            pods.close()
            await runner.cleanup()

    answers, peers = run(scenario)
    assert answers == [(504, b'{"error": "too slow"}')] * 2
    assert len(set(peers)) == 1


def test_an_answer_that_closes_its_connection_is_not_reused():
    async def handler(request):
        return web.Response(body=b"ok", headers={"Connection": "close"})

    async def scenario():
        runner, url, peers = await serve(handler)
        pods = client()
        try:
            return [await pods.post(url, "/v1/ocr", b"{}") for _ in range(3)], peers
        finally:
            pods.close()
            await runner.cleanup()

    answers, peers = run(scenario)
    assert answers == [(200, b"ok")] * 3
    assert len(set(peers)) == 3


def test_no_connection_is_pod_refused():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # nobody listens once it is closed

    async def scenario():
        pods = client()
        with pytest.raises(PodRefused):
            await pods.post(f"http://127.0.0.1:{port}", "/v1/ocr", b"{}")

    run(scenario)


def test_a_connection_dropped_before_the_answer_is_pod_disconnected_and_the_next_post_connects_anew():
    calls = []

    async def handler(request):
        calls.append(1)
        if len(calls) == 1:
            request.transport.close()  # the pod died with the page
            await asyncio.sleep(1)
        return web.Response(body=b"ok")

    async def scenario():
        runner, url, peers = await serve(handler)
        pods = client()
        try:
            with pytest.raises(PodDisconnected):
                await pods.post(url, "/v1/ocr", b"{}")
            return await pods.post(url, "/v1/ocr", b"{}"), peers
        finally:
            pods.close()
            await runner.cleanup()

    answer, peers = run(scenario)
    assert answer == (200, b"ok")
    assert len(set(peers)) == 2


def test_a_pod_too_slow_times_out_and_its_connection_is_not_reused_for_the_next_page():
    calls = []

    async def handler(request):
        calls.append(1)
        if len(calls) == 1:
            await asyncio.sleep(2)
        return web.Response(body=b"late" if len(calls) == 1 else b"ok")

    async def scenario():
        runner, url, peers = await serve(handler)
        pods = client(timeout=0.3)
        try:
            with pytest.raises(TimeoutError):
                await pods.post(url, "/v1/ocr", b"{}")
            return await pods.post(url, "/v1/ocr", b"{}"), peers
        finally:
            pods.close()
            await runner.cleanup()

    answer, peers = run(scenario)
    assert answer == (200, b"ok"), "the first page's late answer is never taken for the second's"
    assert len(set(peers)) == 2


def test_only_plain_http_goes_this_way():
    async def scenario():
        with pytest.raises(ValueError):
            await client().post("https://pod.example", "/v1/ocr", b"{}")

    run(scenario)


# --- the dispatch loop on this client ----------------------------------------------------------------


class PodsFailingWith:
    """A PodClient stand-in whose every POST raises ``error``; remembers the pods asked."""

    def __init__(self, error: Exception):
        self.error = error
        self.asked: list[str] = []

    async def post(self, base_url, path, body, *, token=""):
        self.asked.append(base_url)
        raise self.error


def loop_with(pods) -> tuple:
    from types import SimpleNamespace

    from ocrjobs.dispatch import loop as dispatch
    from ocrjobs.dispatch.lanes import FleetCounts
    from ocrjobs.services.pages import ClaimedPage, page_attempt_failed

    loop = dispatch.DispatchLoop(SimpleNamespace(pool_id=1, token="t", pk=1))
    loop.pods = pods
    failed = []

    async def db(fn, /, **kwargs):
        if fn is page_attempt_failed:
            failed.append(kwargs["error"])
            return "retry"
        return None

    loop.db = db
    loop.wakeup = asyncio.Event()
    loop.lanes.sync([(7, "http://pod-7", 1, "")], FleetCounts(ready=1))
    loop.held[7] = {"a" * 64}  # the pod holds the document: no PUT
    page = ClaimedPage(id=41, job_id=1, position=0, document_id=1, source="p.png", sha256="a" * 64, number=1,
                       languages="eng", attempts=1)  # fmt: skip
    return loop, page, failed


def test_a_pod_that_takes_no_connection_gets_the_page_handed_back_with_no_attempt_spent():
    async def scenario():
        loop, page, failed = loop_with(PodsFailingWith(PodRefused("refused")))
        loop.queue.append(page)
        loop.start_forwards()
        await asyncio.wait_for(asyncio.gather(*loop.flights), GUARD)
        return loop, page, failed

    loop, page, failed = run_plain(scenario)
    assert loop.pods.asked == ["http://pod-7"]
    assert (list(loop.queue), failed) == ([page], []), "back at the head of the queue, no attempt spent"
    assert 7 in loop.shunned and 7 not in loop.lanes.pods


def test_a_connection_broken_after_the_request_went_out_is_a_failed_attempt_of_the_pod():
    async def scenario():
        loop, page, failed = loop_with(PodsFailingWith(PodDisconnected("the pod closed the connection")))
        loop.queue.append(page)
        loop.start_forwards()
        await asyncio.wait_for(asyncio.gather(*loop.flights), GUARD)
        return loop, failed

    loop, failed = run_plain(scenario)
    assert len(failed) == 1 and "the pod is unreachable" in failed[0]
    assert loop.lanes.pods[7].failures == 1 and not loop.queue


def run_plain(scenario):
    return asyncio.run(scenario())
