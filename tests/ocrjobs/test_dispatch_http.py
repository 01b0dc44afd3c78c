"""The dispatcher's keep-alive client for pages' POSTs to pods (ocrjobs/dispatch/http.py), plain and
over TLS, against a real aiohttp server on a local port (TLS: certificates made here, by a CA of the
test's own)."""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import socket
import ssl
from types import SimpleNamespace

import pytest
from aiohttp import web
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from ocrjobs.dispatch.http import PodClient, PodDisconnected, PodRefused

GUARD = 20


def run(scenario):
    return asyncio.run(asyncio.wait_for(scenario(), GUARD))


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


def client(timeout: float = 5.0, ssl_context: ssl.SSLContext | None = None) -> PodClient:
    return PodClient(timeout=timeout, connect_timeout=2.0, ssl_context=ssl_context)


def posts(handler, times: int, tls: ssl.SSLContext | None = None, **options) -> tuple[list, list]:
    """``times`` POSTs one after another on one client to a server whose /v1/ocr is ``handler``
    (over TLS with ``tls``; ``options`` for the client): the answers, and the server's peers."""

    async def scenario():
        runner, url, peers = await serve(handler, tls)
        pods = client(**options)
        try:
            return [await pods.post(url, "/v1/ocr", b"{}") for _ in range(times)], peers
        finally:
            pods.close()
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

    answers, peers = posts(handler, 2)
    assert answers == [(504, b'{"error": "too slow"}')] * 2
    assert len(set(peers)) == 1


def test_an_answer_that_closes_its_connection_is_not_reused():
    async def handler(request):
        return web.Response(body=b"ok", headers={"Connection": "close"})

    answers, peers = posts(handler, 3)
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


def test_only_http_and_https_urls_go_this_way():
    async def scenario():
        for url in ("ftp://pod.example", "pod.example:8000", "https://"):
            with pytest.raises(ValueError):
                await client().post(url, "/v1/ocr", b"{}")

    run(scenario)


def test_a_token_or_path_that_would_break_the_request_head_is_refused_before_anything_is_sent():
    async def scenario():
        async def answer(request):
            return web.json_response({})

        runner, url, peers = await serve(answer)
        try:
            pods = client()
            for base_url, token in ((url, "t\r\nX-Injected: 1"), (url, "t x"), (f"{url}/a b", "t"), (url, "t\0")):
                with pytest.raises(ValueError):
                    await pods.post(base_url, "/v1/ocr", b"{}", token=token)
            assert peers == []
            assert (await pods.post(url, "/v1/ocr", b"{}", token="t"))[0] == 200
            pods.close()
        finally:
            await runner.cleanup()

    run(scenario)


def test_the_host_header_is_the_pods_address_never_credentials_in_its_url():
    async def scenario():
        hosts = []

        async def answer(request):
            hosts.append(request.headers["Host"])
            return web.json_response({})

        runner, url, peers = await serve(answer)
        try:
            pods = client()
            port = url.rsplit(":", 1)[1]
            await pods.post(f"http://user:secret@127.0.0.1:{port}", "/v1/ocr", b"{}")
            assert hosts == [f"127.0.0.1:{port}"]
            pods.close()
        finally:
            await runner.cleanup()

    run(scenario)


# --- answers aiohttp's server never writes, from a server that writes them as given ---------------


async def serve_raw(answers: list[bytes]) -> tuple[asyncio.Server, str, list]:
    """A server that answers its n-th request with ``answers[n]`` as bytes; its URL; the
    connections' client ports, one entry a request."""
    peers: list = []

    async def handle(reader, writer):
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                await reader.readexactly(length)
                peers.append(writer.get_extra_info("peername")[1])
                writer.write(answers[len(peers) - 1])
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", peers


def raw_posts(answers: list[bytes], times: int, **options) -> tuple[list, list]:
    """``times`` POSTs one after another on one client to ``serve_raw(answers)``: the answers, and
    the server's peers."""

    async def scenario():
        server, url, peers = await serve_raw(answers)
        pods = client(**options)
        try:
            return [await pods.post(url, "/v1/ocr", b"{}") for _ in range(times)], peers
        finally:
            pods.close()
            server.close()

    return run(scenario)


def test_an_interim_answer_with_no_length_then_the_answer_in_the_same_bytes_gives_the_answer():
    interim_then_answer = (
        b"HTTP/1.1 103 Early Hints\r\nLink: </s.css>; rel=preload\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
    )
    answers, peers = raw_posts([interim_then_answer] * 2, 2)
    assert answers == [(200, b"ok")] * 2
    assert len(set(peers)) == 1


@pytest.mark.parametrize(
    "lengths", [b"Content-Length: -1\r\n", b"Content-Length: 2\r\nContent-Length: 3\r\n", b"Content-Length: +2\r\n"]
)
def test_an_answer_whose_length_is_negative_or_contradicts_itself_is_pod_disconnected(lengths):
    async def scenario():
        server, url, _ = await serve_raw([b"HTTP/1.1 200 OK\r\n" + lengths + b"\r\n2\r\nok\r\n0\r\n\r\n"])
        pods = client(timeout=2.0)
        try:
            with pytest.raises(PodDisconnected):
                await pods.post(url, "/v1/ocr", b"{}")
        finally:
            pods.close()
            server.close()

    run(scenario)


def test_a_304_or_204_with_a_content_length_has_no_body_and_keeps_the_connection():
    bodiless = [
        b"HTTP/1.1 304 Not Modified\r\nContent-Length: 5\r\n\r\n",
        b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
    ]
    answers, peers = raw_posts(bodiless, 3, timeout=2.0)
    assert answers == [(304, b""), (204, b""), (200, b"ok")]
    assert len(set(peers)) == 1


def test_an_answer_whose_connection_header_lists_close_among_others_is_not_reused():
    answers, peers = raw_posts([b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: TE, close\r\n\r\nok"] * 2, 2)
    assert answers == [(200, b"ok")] * 2
    assert len(set(peers)) == 2


def test_bytes_that_come_after_the_answer_before_its_post_resumes_make_the_connection_unusable():
    from ocrjobs.dispatch.http import _Connection

    async def scenario():
        connection = _Connection()
        connection.answer = asyncio.get_running_loop().create_future()
        connection.data_received(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        connection.data_received(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nlate")  # nobody asked for it
        return connection.answer.result(), connection.reusable

    answer, reusable = run(scenario)
    assert answer == (200, b"ok")
    assert not reusable, "the next page's POST would take these bytes for its answer"


def test_a_post_in_flight_when_the_client_is_closed_leaves_no_connection_open():
    async def handler(request):
        await asyncio.sleep(0.3)
        return web.Response(body=b"ok")

    async def scenario():
        runner, url, _ = await serve(handler)
        pods = client()
        try:
            post = asyncio.ensure_future(pods.post(url, "/v1/ocr", b"{}"))
            await asyncio.sleep(0.1)
            pods.close()
            answer = await post
            return answer, [c for idle in pods._idle.values() for c in idle if not c.transport.is_closing()]
        finally:
            await runner.cleanup()

    answer, open_connections = run(scenario)
    assert answer == (200, b"ok")
    assert open_connections == []


def test_a_connection_idle_longer_than_idle_seconds_is_not_reused(monkeypatch):
    from ocrjobs.dispatch import http

    monkeypatch.setattr(http, "IDLE_SECONDS", 0.2)

    async def handler(request):
        return web.Response(body=b"ok")

    async def scenario():
        runner, url, peers = await serve(handler)
        pods = client()
        try:
            await pods.post(url, "/v1/ocr", b"{}")
            await pods.post(url, "/v1/ocr", b"{}")  # at once: the same connection
            await asyncio.sleep(0.3)  # as a pod's server may be closing it by now
            await pods.post(url, "/v1/ocr", b"{}")
        finally:
            pods.close()
            await runner.cleanup()
        return peers

    peers = run(scenario)
    assert peers[0] == peers[1] != peers[2]


# --- over TLS (RunPod's proxy) ----------------------------------------------------------------------


def test_over_tls_posts_carry_token_and_body_on_one_kept_connection(tls):
    seen = []

    async def handler(request):
        seen.append((request.secure, request.headers.get("Authorization"), await request.read()))
        return web.json_response({"text": "hi"})

    async def scenario():
        runner, url, peers = await serve(handler, tls.server("127.0.0.1"))
        pods = client(ssl_context=tls.trusting)
        try:
            answers = [await pods.post(url, "/v1/ocr", b'{"page": %d}' % n, token="tok") for n in (1, 2, 3)]
        finally:
            pods.close()
            await runner.cleanup()
        return url, answers, peers

    url, answers, peers = run(scenario)
    assert url.startswith("https://")
    assert answers == [(200, b'{"text": "hi"}')] * 3
    assert seen == [(True, "Bearer tok", b'{"page": %d}' % n) for n in (1, 2, 3)]
    assert len(set(peers)) == 1, "one TLS connection, kept alive"


def test_over_tls_a_chunked_answer_is_read_whole_and_the_connection_is_kept(tls):
    async def handler(request):
        response = web.StreamResponse(status=524)  # as Cloudflare may answer: chunked
        response.enable_chunked_encoding()
        await response.prepare(request)
        for part in (b"<html>", b"a timeout occurred", b"</html>"):
            await response.write(part)
        await response.write_eof()
        return response

    answers, peers = posts(handler, 2, tls.server("127.0.0.1"), ssl_context=tls.trusting)
    assert answers == [(524, b"<html>a timeout occurred</html>")] * 2
    assert len(set(peers)) == 1


def refused_over_tls(server_tls: ssl.SSLContext | None, **options) -> tuple[PodRefused, list]:
    """A POST over TLS to a server answering "ok" (over TLS with ``server_tls``, else plain HTTP
    only), which must raise PodRefused: that error, and the peers the server saw."""

    async def handler(request):
        return web.Response(body=b"ok")

    async def scenario():
        runner, url, peers = await serve(handler, server_tls)
        pods = client(**options)
        try:
            with pytest.raises(PodRefused) as refused:
                await pods.post(url.replace("http://", "https://"), "/v1/ocr", b"{}")
        finally:
            pods.close()
            await runner.cleanup()
        return refused.value, peers

    return run(scenario)


def test_over_tls_a_certificate_no_trusted_ca_issued_is_pod_refused_and_nothing_is_posted(tls):
    # The default context: the system's CAs, which never issued the test CA's.
    refused, peers = refused_over_tls(tls.server("127.0.0.1"))
    assert isinstance(refused.__cause__, ssl.SSLCertVerificationError)
    assert peers == []


def test_over_tls_a_certificate_for_another_host_is_pod_refused(tls):
    refused, peers = refused_over_tls(tls.server("pod.example"), ssl_context=tls.trusting)  # not 127.0.0.1's
    assert isinstance(refused.__cause__, ssl.SSLCertVerificationError)
    assert "mismatch" in str(refused.__cause__)
    assert peers == []


def test_a_tls_handshake_with_a_pod_that_speaks_no_tls_is_pod_refused(tls):
    refused, peers = refused_over_tls(None, ssl_context=tls.trusting)
    assert isinstance(refused.__cause__, ssl.SSLError)
    assert peers == []


def test_an_https_url_never_reuses_a_plain_connection_to_the_same_host_and_port(tls):
    async def handler(request):
        return web.Response(body=b"ok")

    async def scenario():
        runner, url, peers = await serve(handler)  # plain HTTP only
        pods = client(ssl_context=tls.trusting)
        try:
            first = await pods.post(url, "/v1/ocr", b"{}")  # leaves an idle plain connection
            with pytest.raises(PodRefused):  # a TLS handshake of its own, which this pod cannot do
                await pods.post(url.replace("http://", "https://"), "/v1/ocr", b"{}")
        finally:
            pods.close()
            await runner.cleanup()
        return first, peers

    first, peers = run(scenario)
    assert first == (200, b"ok")
    assert len(peers) == 1, "the page meant for TLS was never sent in the clear"


# --- the dispatch loop on this client ----------------------------------------------------------------


class PodsFailingWith:
    """A PodClient stand-in whose every POST raises ``error``; remembers the pods asked."""

    def __init__(self, error: Exception):
        self.error = error
        self.asked: list[str] = []

    async def post(self, base_url, path, body, *, token=""):
        self.asked.append(base_url)
        raise self.error


def loop_with(pods, base_url: str = "http://pod-7") -> tuple:
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
    loop.lanes.sync([(7, base_url, 1, "")], FleetCounts(ready=1))
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


def test_a_tls_pods_page_is_posted_on_the_pods_client_and_its_answer_kept(tls):
    async def handler(request):
        return web.json_response({"text": "over tls"})

    async def scenario():
        runner, url, peers = await serve(handler, tls.server("127.0.0.1"))
        loop, page, failed = loop_with(client(ssl_context=tls.trusting), base_url=url)
        try:
            loop.queue.append(page)
            loop.start_forwards()
            await asyncio.wait_for(asyncio.gather(*loop.flights), GUARD)
        finally:
            loop.pods.close()
            await runner.cleanup()
        return loop, failed, peers

    loop, failed, peers = run_plain(scenario)
    assert failed == [] and len(peers) == 1
    assert [(result.page_id, result.result) for result in loop.results] == [(41, {"text": "over tls"})]


def test_a_tls_pod_whose_certificate_is_not_trusted_gets_no_page_the_page_handed_back_no_attempt_spent(tls):
    async def handler(request):
        return web.json_response({"text": "never asked"})

    async def scenario():
        runner, url, peers = await serve(handler, tls.server("127.0.0.1"))
        loop, page, failed = loop_with(client(), base_url=url)  # the system's CAs: the test CA is not one
        try:
            loop.queue.append(page)
            loop.start_forwards()
            await asyncio.wait_for(asyncio.gather(*loop.flights), GUARD)
        finally:
            loop.pods.close()
            await runner.cleanup()
        return loop, page, failed, peers

    loop, page, failed, peers = run_plain(scenario)
    assert peers == [] and loop.results == []
    assert (list(loop.queue), failed) == ([page], []), "back at the head of the queue, no attempt spent"
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
