"""The dispatcher's page POSTs to pods (ocrjobs/dispatch/http.py: aiohttp, a total deadline, a cap on
the answer), plain and over TLS, against a real aiohttp server on a local port (TLS: certificates made
here, by a CA of the test's own); and the dispatch loop on them against fake pods that answer
malformed HTTP from a raw socket, next to a pod that answers well."""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import ssl
import threading
from types import SimpleNamespace

import aiohttp
import pytest
from aiohttp import web
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from ocrjobs.dispatch.http import AnswerTooLarge, PodPages, PodRefused, pod_session
from ocrjobs.dispatch.lanes import FleetCounts
from pods.providers.local import free_port
from podserver.answers import PageAnswer

GUARD = 20


def run(scenario):
    return asyncio.run(asyncio.wait_for(scenario(), GUARD))


def run_guarded(scenario):
    """Run ``scenario`` on an event loop of its own thread: a loop stuck for good (never yielding,
    so no asyncio timeout of its own can fire) fails the test instead of hanging it."""
    outcome: dict = {}

    def main():
        try:
            outcome["value"] = asyncio.run(scenario())
        except BaseException as exc:  # handed to the test's thread
            outcome["error"] = exc

    thread = threading.Thread(target=main, daemon=True)
    thread.start()
    thread.join(GUARD)
    assert not thread.is_alive(), "the dispatch loop is stuck"
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


async def serve(handler, tls: ssl.SSLContext | None = None) -> tuple[web.AppRunner, str, list]:
    """A server whose /v1/ocr is ``handler`` (over TLS with ``tls``); its base URL; the peers (client
    ports) it saw, in order."""
    peers: list = []

    async def ocr(request):
        peers.append(request.transport.get_extra_info("peername")[1])
        return await handler(request)

    app = web.Application()
    app.router.add_post("/v1/ocr", ocr)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=tls)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    return runner, f"{'https' if tls else 'http'}://127.0.0.1:{port}", peers


def client(deadline: float = 5.0, ssl_context: ssl.SSLContext | None = None, max_bytes: int = 1 << 20) -> PodPages:
    """Page POSTs on a session of their own (made in the running loop; ``close(pods)`` ends it)."""
    return PodPages(pod_session(deadline=deadline, ssl_context=ssl_context), deadline=deadline, max_bytes=max_bytes)


async def close(pods: PodPages) -> None:
    await pods.session.close()


def posts(handler, times: int, tls: ssl.SSLContext | None = None, **options) -> tuple[list, list]:
    """``times`` POSTs one after another on one client to a server whose /v1/ocr is ``handler``
    (over TLS with ``tls``; ``options`` for the client): the answers, and the server's peers."""

    async def scenario():
        runner, url, peers = await serve(handler, tls)
        pods = client(**options)
        try:
            return [await pods.post(url, "/v1/ocr", b"{}") for _ in range(times)], peers
        finally:
            await close(pods)
            await runner.cleanup()

    return run(scenario)


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _issue(subject: str, key, issuer: str, issuer_key, extensions) -> bytes:
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(_name(issuer))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key.public_key()), critical=False)
    )
    for extension, critical in extensions:
        builder = builder.add_extension(extension, critical=critical)
    return builder.sign(issuer_key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM)


@pytest.fixture(scope="module")
def tls(tmp_path_factory) -> SimpleNamespace:
    """A CA of the test's own; ``trusting``: a client context that trusts it (and nothing else);
    ``server(names)``: a server context whose certificate that CA issued for ``names`` (DNS names or
    IP addresses)."""
    folder = tmp_path_factory.mktemp("tls")
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_usage = x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                             data_encipherment=False, key_agreement=False, key_cert_sign=True, crl_sign=True,
                             encipher_only=False, decipher_only=False)  # fmt: skip
    ca = _issue("fleetadmin test CA", ca_key, "fleetadmin test CA", ca_key,
                [(x509.BasicConstraints(ca=True, path_length=None), True), (ca_usage, True)])  # fmt: skip

    def server(*names: str) -> ssl.SSLContext:
        key = ec.generate_private_key(ec.SECP256R1())
        alt = []
        for name in names:
            try:
                alt.append(x509.IPAddress(ipaddress.ip_address(name)))
            except ValueError:
                alt.append(x509.DNSName(name))
        cert = _issue(names[0], key, "fleetadmin test CA", ca_key, [
            (x509.SubjectAlternativeName(alt), False),
            (x509.BasicConstraints(ca=False, path_length=None), True),
            (x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), False),
        ])  # fmt: skip
        stem = folder / "-".join(names)
        stem.with_suffix(".crt").write_bytes(cert)
        stem.with_suffix(".key").write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(stem.with_suffix(".crt"), stem.with_suffix(".key"))
        return context

    return SimpleNamespace(trusting=ssl.create_default_context(cadata=ca.decode()), server=server)


def test_a_post_carries_the_token_and_body_and_gets_status_and_body_on_one_kept_connection():
    seen = []

    async def handler(request):
        seen.append((request.headers.get("Authorization"), request.content_type, request.headers.get("Accept-Encoding"),
                     await request.read()))  # fmt: skip
        return web.json_response({"text": "hi"}, status=201)

    async def scenario():
        runner, url, peers = await serve(handler)
        pods = client()
        try:
            answers = [await pods.post(url, "/v1/ocr", b'{"page": %d}' % n, token="tok") for n in (1, 2, 3)]
        finally:
            await close(pods)
            await runner.cleanup()
        return answers, peers

    answers, peers = run(scenario)
    assert answers == [(201, b'{"text": "hi"}')] * 3
    assert seen == [("Bearer tok", "application/json", "identity", b'{"page": %d}' % n) for n in (1, 2, 3)]
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
            await close(pods)
            await runner.cleanup()

    assert run(scenario) == [(200, (b"page-%03d" % n)[::-1]) for n in range(100)]


def test_posts_to_pods_behind_one_host_are_all_out_at_once_however_many():
    # Pods behind one gateway share its host and port: lanes bound what each pod is sent, the
    # session does not. 300 POSTs, each answered only once all 300 have arrived (with a cap of 256
    # per host, as the session had, 44 waited for a connection that never came free).
    count = 300

    async def scenario():
        arrived = []
        everyone = asyncio.Event()

        async def handler(request):
            arrived.append(await request.read())
            if len(arrived) == count:
                everyone.set()
            try:
                await asyncio.wait_for(everyone.wait(), 5)
            except TimeoutError:
                return web.Response(status=503, body=b"not all arrived")
            return web.Response(body=b"ok")

        runner, url, peers = await serve(handler)
        pods = client()
        try:
            answers = await asyncio.gather(*(pods.post(url, "/v1/ocr", b"page-%03d" % n) for n in range(count)))
        finally:
            await close(pods)
            await runner.cleanup()
        return answers, peers

    answers, peers = run(scenario)
    assert answers == [(200, b"ok")] * count
    assert len(set(peers)) == count


def test_pods_named_under_localhost_are_reached_on_loopback_each_name_in_its_host_header():
    # As the simulator names pods (a host each, as RunPod's proxy does): RFC 6761 loopback names,
    # which this machine's C library resolves nowhere.
    hosts = []

    async def handler(request):
        hosts.append(request.headers["Host"])
        return web.Response(body=b"ok")

    async def scenario():
        runner, url, peers = await serve(handler)
        port = url.rpartition(":")[2]
        pods = client()
        try:
            return [await pods.post(f"http://pod{n}-8000.proxy.localhost:{port}", "/v1/ocr", b"{}") for n in (1, 2, 1)]
        finally:
            await close(pods)
            await runner.cleanup()

    assert run(scenario) == [(200, b"ok")] * 3
    assert [host.partition(":")[0] for host in hosts] == [f"pod{n}-8000.proxy.localhost" for n in (1, 2, 1)]


def test_a_chunked_answer_is_read_whole_and_the_connection_is_kept():
    async def handler(request):
        response = web.StreamResponse(status=504)
        response.enable_chunked_encoding()
        await response.prepare(request)
        for part in (b'{"error": ', b'"too slow"', b"}"):
            await response.write(part)
        await response.write_eof()
        return response

    answers, peers = posts(handler, 2)
    assert answers == [(504, b'{"error": "too slow"}')] * 2
    assert len(set(peers)) == 1


def test_an_answer_of_exactly_the_cap_is_kept_longer_ones_are_answer_too_large_and_not_read_on():
    async def handler(request):
        size = int((await request.read()).decode())
        response = web.StreamResponse()
        response.enable_chunked_encoding()  # no length to refuse up front: the read itself stops
        await response.prepare(request)
        await response.write(b"x" * size)
        await response.write_eof()
        return response

    async def scenario():
        runner, url, peers = await serve(handler)
        pods = client(max_bytes=1000)
        try:
            kept = await pods.post(url, "/v1/ocr", b"1000")
            with pytest.raises(AnswerTooLarge):
                await pods.post(url, "/v1/ocr", b"1001")
            with pytest.raises(AnswerTooLarge):
                await pods.post(url, "/v1/ocr", b"10000000")  # 10 MB: far more than is ever read
            again = await pods.post(url, "/v1/ocr", b"10")
            return kept, again, peers
        finally:
            await close(pods)
            await runner.cleanup()

    kept, again, peers = run(scenario)
    assert (kept, again) == ((200, b"x" * 1000), (200, b"x" * 10))
    assert peers[2] != peers[3], "the connection of the answer cut short is closed, not read to its end"


def test_an_answer_that_closes_its_connection_is_not_reused():
    async def handler(request):
        return web.Response(body=b"ok", headers={"Connection": "close"})

    answers, peers = posts(handler, 3)
    assert answers == [(200, b"ok")] * 3
    assert len(set(peers)) == 3


def test_no_connection_is_pod_refused():
    port = free_port()

    async def scenario():
        pods = client()
        try:
            with pytest.raises(PodRefused):
                await pods.post(f"http://127.0.0.1:{port}", "/v1/ocr", b"{}")
        finally:
            await close(pods)

    run(scenario)


def test_a_connection_dropped_before_the_answer_is_a_client_error_and_the_next_post_connects_anew():
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
            with pytest.raises(aiohttp.ClientError) as caught:
                await pods.post(url, "/v1/ocr", b"{}")
            assert not isinstance(caught.value, PodRefused)
            return await pods.post(url, "/v1/ocr", b"{}"), peers
        finally:
            await close(pods)
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
        pods = client(deadline=0.3)
        try:
            with pytest.raises(TimeoutError):
                await pods.post(url, "/v1/ocr", b"{}")
            return await pods.post(url, "/v1/ocr", b"{}"), peers
        finally:
            await close(pods)
            await runner.cleanup()

    answer, peers = run(scenario)
    assert answer == (200, b"ok"), "the first page's late answer is never taken for the second's"
    assert len(set(peers)) == 2


def test_only_http_and_https_urls_go_this_way():
    async def scenario():
        pods = client()
        try:
            for url in ("ftp://pod.example", "pod.example:8000", "https://"):
                with pytest.raises(ValueError):
                    await pods.post(url, "/v1/ocr", b"{}")
        finally:
            await close(pods)

    run(scenario)


def test_a_token_that_would_break_the_request_head_is_refused_before_anything_is_sent():
    async def scenario():
        async def answer(request):
            return web.json_response({})

        runner, url, peers = await serve(answer)
        pods = client()
        try:
            for token in ("t\r\nX-Injected: 1", "t\nX-Injected: 1", "t\0"):
                with pytest.raises(ValueError):
                    await pods.post(url, "/v1/ocr", b"{}", token=token)
            assert peers == []
            assert (await pods.post(url, "/v1/ocr", b"{}", token="t"))[0] == 200
        finally:
            await close(pods)
            await runner.cleanup()

    run(scenario)


def test_the_host_header_is_the_pods_address_never_credentials_in_its_url():
    async def scenario():
        seen = []

        async def answer(request):
            seen.append((request.headers["Host"], request.headers.get("Authorization")))
            return web.json_response({})

        runner, url, _ = await serve(answer)
        pods = client()
        try:
            port = url.rsplit(":", 1)[1]
            await pods.post(f"http://user:secret@127.0.0.1:{port}", "/v1/ocr", b"{}")
            await pods.post(f"http://user:secret@127.0.0.1:{port}", "/v1/ocr", b"{}", token="tok")
            return seen, port
        finally:
            await close(pods)
            await runner.cleanup()

    seen, port = run(scenario)
    assert seen == [(f"127.0.0.1:{port}", None), (f"127.0.0.1:{port}", "Bearer tok")]


def test_over_tls_posts_carry_token_and_body_on_one_kept_connection(tls):
    seen = []

    async def handler(request):
        seen.append((request.headers.get("Authorization"), await request.read()))
        return web.json_response({"text": "secret"})

    answers, peers = posts(handler, 3, tls=tls.server("127.0.0.1"), ssl_context=tls.trusting)
    assert answers == [(200, b'{"text": "secret"}')] * 3
    assert seen == [(None, b"{}")] * 3
    assert len(set(peers)) == 1, "one TLS connection, kept alive"


def refused_over_tls(server_tls: ssl.SSLContext | None, host: str = "127.0.0.1", **options) -> tuple[Exception, list]:
    async def handler(request):
        return web.json_response({})

    async def scenario():
        runner, url, peers = await serve(handler, server_tls)
        port = url.rsplit(":", 1)[1]
        pods = client(**options)
        try:
            with pytest.raises(PodRefused) as refused:
                await pods.post(f"https://{host}:{port}", "/v1/ocr", b"{}")
            return refused.value, peers
        finally:
            await close(pods)
            await runner.cleanup()

    return run(scenario)


def test_over_tls_a_certificate_no_trusted_ca_issued_is_pod_refused_and_nothing_is_posted(tls):
    error, peers = refused_over_tls(tls.server("127.0.0.1"))  # the system's CAs: the test CA is not one
    assert peers == []
    assert isinstance(error.__cause__, aiohttp.ClientConnectorCertificateError)


def test_over_tls_a_certificate_for_another_host_is_pod_refused(tls):
    error, peers = refused_over_tls(tls.server("pod.elsewhere.example"), ssl_context=tls.trusting)
    assert peers == []
    assert isinstance(error.__cause__, aiohttp.ClientConnectorCertificateError)


def test_a_tls_handshake_with_a_pod_that_speaks_no_tls_is_pod_refused(tls):
    _, peers = refused_over_tls(None, ssl_context=tls.trusting)
    assert peers == []


# --- the dispatch loop on these POSTs: malformed answers cost their page an attempt, the loop goes on


async def serve_raw(answer) -> tuple[asyncio.Server, str, asyncio.Event]:
    """A fake pod on a raw socket: reads a request, then ``answer(writer)`` writes whatever bytes it
    likes; its URL, and an event set once it has answered (or started to)."""
    answered = asyncio.Event()

    async def handle(reader, writer):
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            await reader.readexactly(length)
            await answer(writer, answered)
            await asyncio.sleep(GUARD)  # keep the connection open: the client must end it
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", answered


def answering(data: bytes):
    async def answer(writer, answered):
        writer.write(data)
        await writer.drain()
        answered.set()

    return answer


async def trickling(writer, answered):
    """A head that promises 1,000 bytes, then a byte every 50 ms: past any sane deadline."""
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{")
    await writer.drain()
    answered.set()
    while True:
        await asyncio.sleep(0.05)
        writer.write(b" ")
        await writer.drain()


async def closing(writer, answered):
    """The pod dies with the page: the connection closes with no answer."""
    answered.set()
    writer.transport.abort()


MAX_BYTES = 64 * 1024


def loop_with(pods: dict[int, str], *, deadline: float = 5.0) -> tuple:
    """A real dispatch loop (its database calls recorded, not made) whose pods are ``pods`` (id ->
    base URL), one lane each; pod 7 holds document a…, pod 8 document b…: page 41 (of a…) goes to
    pod 7, page 42 (of b…) to pod 8. Call in the running loop."""
    from ocrjobs.dispatch import loop as dispatch
    from ocrjobs.services.pages import ClaimedPage, page_attempt_failed

    loop = dispatch.DispatchLoop(SimpleNamespace(pool_id=1, token="t", pk=1))
    loop.client = pod_session(deadline=GUARD)
    loop.pods = PodPages(loop.client, deadline=deadline, max_bytes=MAX_BYTES)
    failed = []

    async def db(fn, /, **kwargs):
        if fn is page_attempt_failed:
            # What was stored by then: a pod that hangs must not hold up the other pod's page.
            failed.append((kwargs["page_id"], kwargs["attempt"], kwargs["error"], [r.page_id for r in loop.results]))
            return "retry"
        return None

    loop.db = db
    loop.wakeup = asyncio.Event()
    loop.lanes.sync([(pod_id, url, 1, "") for pod_id, url in pods.items()], FleetCounts(ready=len(pods)))
    for pod_id, letter in ((7, "a"), (8, "b")):
        loop.held[pod_id] = {letter * 64}  # the pod holds the document: no PUT
    pages = [ClaimedPage(id=41 + n, job_id=1, position=n, document_id=1 + n, source="p.png", sha256=letter * 64,
                         number=1, languages="eng", attempts=1) for n, letter in enumerate("ab")]  # fmt: skip
    return loop, pages, failed


async def forward_all(loop, pages) -> None:
    loop.queue.extend(pages)
    loop.start_forwards()
    try:
        await asyncio.wait_for(asyncio.gather(*loop.flights), GUARD)
    finally:
        await loop.client.close()


def beside_a_good_pod(bad_answer, *, deadline: float = 5.0, answer_first: bool = True):
    """Pages 41 to a fake pod answering ``bad_answer`` and 42 to a well-behaved pod, at once, through
    the dispatch loop. With ``answer_first`` the good pod answers only after the bad one has (a loop
    stuck on the bad answer never gets its page; run_guarded fails the test)."""

    async def scenario():
        server, bad_url, answered = await serve_raw(bad_answer)

        async def good(request):
            await request.read()
            await answered.wait()
            return web.json_response({"text": "from pod 8"})

        runner, good_url, _ = await serve(good)
        loop, pages, failed = loop_with({7: bad_url, 8: good_url}, deadline=deadline)
        try:
            await forward_all(loop, pages)
        finally:
            server.close()
            await runner.cleanup()
        return loop, failed

    return run_guarded(scenario)


CHUNKED_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"


@pytest.mark.parametrize(
    ("answer", "error"),
    [
        # A size line that is no hex number: the hand-written client's parse went 16 bytes back, to
        # the start of these 9, and round again for good, the loop stuck.
        pytest.param(CHUNKED_HEAD + b"-10\r\nabcd", "the pod is unreachable", id="chunk-size-minus-10"),
        pytest.param(
            CHUNKED_HEAD + b"-10\r\n" + b"x" * 40 + b"\r\n0\r\n\r\n",
            "the pod is unreachable",
            id="chunk-size-minus-10-then-more",
        ),  # fmt: skip
        pytest.param(CHUNKED_HEAD + b"0x5\r\nhello\r\n0\r\n\r\n", "the pod is unreachable", id="chunk-size-0x5"),
        pytest.param(
            b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % (MAX_BYTES + 1),
            "POD_ANSWER_MAX_BYTES",
            id="length-over-the-cap",
        ),  # fmt: skip
        pytest.param(
            CHUNKED_HEAD + (b"1000\r\n" + b"x" * 4096 + b"\r\n") * 17 + b"0\r\n\r\n",
            "POD_ANSWER_MAX_BYTES",
            id="chunked-over-the-cap",
        ),  # fmt: skip
        pytest.param(
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
            "the pod is unreachable",
            id="both-lengths",
        ),  # fmt: skip
        pytest.param(b"HTTX/1.1 2OO OK\r\nContent-Length: 2\r\n\r\n{}", "the pod is unreachable", id="garbage-status"),
        pytest.param(b"\x16\x03\x01 not HTTP at all\r\n\r\n", "the pod is unreachable", id="not-http"),
        pytest.param(closing, "the pod is unreachable", id="connection-closed"),
        # HTTP well formed, but no page's answer (podserver.answers.PageAnswer): refused as it is parsed.
        pytest.param(
            b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\n[1, 2]", "not a page's: the answer", id="not-an-object"
        ),  # fmt: skip
        pytest.param(
            b'HTTP/1.1 200 OK\r\nContent-Length: 11\r\n\r\n{"text": 5}', "not a page's: text", id="text-not-a-string"
        ),  # fmt: skip
        pytest.param(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n{nope", "not a page's", id="not-json"),
    ],
)
def test_a_malformed_answer_costs_its_page_an_attempt_and_the_other_pods_page_is_done(answer, error):
    loop, failed = beside_a_good_pod(answer if callable(answer) else answering(answer))
    assert [(page_id, attempt) for page_id, attempt, _, _ in failed] == [(41, 1)], "one attempt spent, page 41's"
    assert error in failed[0][2]
    assert loop.lanes.pods[7].failures == 1, "a fault of the pod"
    assert [(result.page_id, result.pod_id, result.result) for result in loop.results] == [
        (42, 8, PageAnswer(text="from pod 8"))
    ]
    assert not loop.queue and not loop.inflight and not loop.forwarding, "nothing left hanging"


def test_a_pod_that_trickles_past_the_deadline_costs_its_page_an_attempt_while_the_other_pods_page_is_done():
    loop, failed = beside_a_good_pod(trickling, deadline=1.0)
    assert [(page_id, attempt) for page_id, attempt, _, _ in failed] == [(41, 1)]
    page_id, _, error, stored_by_then = failed[0]
    assert error == "the pod did not answer in time"
    assert stored_by_then == [42], "pod 8's page was done while pod 7 still trickled"
    assert loop.lanes.pods[7].failures == 1
    assert [result.page_id for result in loop.results] == [42]


def test_a_pods_answer_to_a_documents_put_over_the_cap_costs_the_page_an_attempt(settings):
    settings.POD_ANSWER_MAX_BYTES = MAX_BYTES

    async def scenario():
        server, url, _ = await serve_raw(
            answering(b"HTTP/1.1 201 Created\r\nContent-Length: %d\r\n\r\n" % (MAX_BYTES + 1))
        )
        loop, pages, failed = loop_with({7: url})
        loop.held.clear()  # the pod holds no document: the page's goes first, by PUT

        async def io(fn, *args):
            return b"png", None  # the document's bytes, no file to close (document_body)

        loop.io = io
        try:
            await forward_all(loop, pages[:1])
        finally:
            server.close()
        return loop, failed

    loop, failed = run_guarded(scenario)
    assert [(page_id, attempt) for page_id, attempt, _, _ in failed] == [(41, 1)]
    assert "POD_ANSWER_MAX_BYTES" in failed[0][2]
    assert loop.lanes.pods[7].failures == 1 and not loop.results and not loop.queue


def test_a_pod_that_takes_no_connection_gets_the_page_handed_back_with_no_attempt_spent_then_done_on_another():
    async def scenario():
        async def good(request):
            return web.json_response({"text": "from pod 8"})

        runner, good_url, _ = await serve(good)
        loop, pages, failed = loop_with({7: f"http://127.0.0.1:{free_port()}"})
        try:
            loop.queue.append(pages[0])
            loop.start_forwards()
            await asyncio.wait_for(asyncio.gather(*loop.flights), GUARD)
            handed_back = list(loop.queue)
            shunned = 7 in loop.shunned and 7 not in loop.lanes.pods
            loop.lanes.sync([(8, good_url, 1, "")], FleetCounts(ready=1))
            loop.held[8] = {"a" * 64}
            await forward_all(loop, [])
        finally:
            await runner.cleanup()
        return loop, pages, failed, handed_back, shunned

    loop, pages, failed, handed_back, shunned = run_guarded(scenario)
    assert (handed_back, failed) == ([pages[0]], []), "back at the head of the queue, no attempt spent"
    assert shunned
    assert [(result.page_id, result.pod_id) for result in loop.results] == [(41, 8)]


def run_plain(scenario):
    return asyncio.run(scenario())


def test_a_tls_pods_page_is_posted_and_its_answer_kept(tls):
    async def handler(request):
        return web.json_response({"text": "over tls"})

    async def scenario():
        runner, url, peers = await serve(handler, tls.server("127.0.0.1"))
        loop, pages, failed = loop_with({7: url})
        loop.pods.session = loop.client = pod_session(deadline=GUARD, ssl_context=tls.trusting)
        try:
            await forward_all(loop, pages[:1])
        finally:
            await runner.cleanup()
        return loop, failed, peers

    loop, failed, peers = run_plain(scenario)
    assert failed == [] and len(peers) == 1
    assert [(result.page_id, result.result) for result in loop.results] == [(41, PageAnswer(text="over tls"))]


def test_a_tls_pod_whose_certificate_is_not_trusted_gets_no_page_the_page_handed_back_no_attempt_spent(tls):
    async def handler(request):
        return web.json_response({"text": "never asked"})

    async def scenario():
        runner, url, peers = await serve(handler, tls.server("127.0.0.1"))
        loop, pages, failed = loop_with({7: url})  # the system's CAs: the test CA is not one
        try:
            await forward_all(loop, pages[:1])
        finally:
            await runner.cleanup()
        return loop, pages, failed, peers

    loop, pages, failed, peers = run_plain(scenario)
    assert peers == [] and loop.results == []
    assert (list(loop.queue), failed) == ([pages[0]], []), "back at the head of the queue, no attempt spent"
    assert 7 in loop.shunned and 7 not in loop.lanes.pods


def test_the_loop_sends_a_tls_pods_document_and_page_trusting_the_context_it_was_given(
    tls, monkeypatch, settings, transactional_db, ordinary_user
):
    from ocrjobs.dispatch import loop as dispatch
    from ocrjobs.models import Page
    from ocrjobs.services.dispatchers import dispatcher_register
    from pods.models import Pod
    from tests.factories import image_bytes
    from tests.ocrjobs.conftest import running_sim_pool
    from tests.ocrjobs.helpers import split, submit

    with running_sim_pool(monkeypatch, settings, tls=tls.server("127.0.0.1")) as sim_pool:
        assert sim_pool.pod.base_url.startswith("https://127.0.0.1:")
        job = submit(ordinary_user, {"note.png": image_bytes(["a note"])}, pool_key=sim_pool.pool.key)
        split(job)
        loop = dispatch.DispatchLoop(dispatcher_register(pool_id=sim_pool.pool.pk))
        loop.ssl_context = tls.trusting  # the documents' PUT and the page's POST both trust the test CA
        asyncio.run(asyncio.wait_for(dispatch._watched(loop, name="dispatcher over TLS"), 60))
        stats = sim_pool.sim.stats()

    page = Page.objects.get(job=job)
    assert (page.status, page.attempts) == (Page.Status.DONE, 1)
    assert stats["ocr_pages"] == 1
    assert Pod.objects.get(pk=sim_pool.pod.pk).state == Pod.State.READY
