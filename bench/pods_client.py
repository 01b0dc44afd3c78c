"""The dispatcher's CPU per page POST: aiohttp against its own client (ocrjobs/dispatch/http.py).

    .venv/bin/python bench/pods_client.py              # over TLS (as to RunPod's proxy)
    .venv/bin/python bench/pods_client.py --plain      # plain HTTP
    .venv/bin/python bench/pods_client.py --requests 20000 --in-flight 128 --rounds 3

A local aiohttp server (its own process, a certificate from a CA made here) answers every
``POST /v1/ocr`` with a small JSON; this process sends the same POSTs through each client in turn,
back to back, and prints the CPU seconds it spent per request (the server's are not counted).
Ends with one JSON line whose "goal" names every_request_answered (each client had every request
it sent answered 200: counted) and pod_client_cheaper (PodClient's CPU per request no more than
aiohttp's: this machine's, not asserted by CI). CI's size (tests/bench/test_pods_client.py):

    .venv/bin/python bench/pods_client.py --requests 2000 --in-flight 32 --rounds 1
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import ssl
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

PAYLOAD = json.dumps({"document": "a" * 64, "page": 1, "dpi": 200, "languages": "eng"}).encode()


def make_certificates(folder: Path) -> tuple[Path, Path, Path]:
    """A CA, and a certificate it issued for 127.0.0.1: (ca.pem, cert.pem, key.pem)."""
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)

    def issue(subject, key, issuer_key, extensions):
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
            .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "bench CA")]))
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=1))
        )
        for extension in extensions:
            builder = builder.add_extension(extension, critical=False)
        return builder.sign(issuer_key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM)

    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca = issue("bench CA", ca_key, ca_key, [x509.BasicConstraints(ca=True, path_length=None)])
    cert = issue(
        "127.0.0.1", key, ca_key, [x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))])]
    )
    paths = folder / "ca.pem", folder / "cert.pem", folder / "key.pem"
    paths[0].write_bytes(ca)
    paths[1].write_bytes(cert)
    paths[2].write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return paths


def serve(port_file: str, cert: str, key: str) -> None:
    from aiohttp import web

    async def ocr(request):
        await request.read()
        return web.json_response({"text": "x", "confidence": 0.9})

    async def main():
        app = web.Application()
        app.router.add_post("/v1/ocr", ocr)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        context = None
        if cert:
            context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            context.load_cert_chain(cert, key)
        site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context, backlog=1024)
        await site.start()
        port = str(site._server.sockets[0].getsockname()[1])
        await asyncio.to_thread(Path(port_file).write_text, port)  # no file I/O on the loop (invariant 2)
        await asyncio.Event().wait()

    asyncio.run(main())


async def with_aiohttp(url: str, context: ssl.SSLContext, requests: int, in_flight: int) -> tuple[float, int, int]:
    import aiohttp

    timeout = aiohttp.ClientTimeout(total=60, sock_connect=5.0)
    connector = aiohttp.TCPConnector(limit=0, limit_per_host=0, ttl_dns_cache=300, ssl=context)
    headers = {"Authorization": "Bearer tok", "Content-Type": "application/json"}
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as client:

        async def one():
            async with client.post(f"{url}/v1/ocr", data=PAYLOAD, headers=headers) as response:
                await response.read()
                return response.status == 200

        return await drive(one, requests, in_flight)


async def with_pod_client(url: str, context: ssl.SSLContext, requests: int, in_flight: int) -> tuple[float, int, int]:
    from ocrjobs.dispatch.http import PodClient

    pods = PodClient(timeout=60, connect_timeout=5.0, ssl_context=context)

    async def one():
        status, _ = await pods.post(url, "/v1/ocr", PAYLOAD, token="tok")
        return status == 200

    try:
        return await drive(one, requests, in_flight)
    finally:
        pods.close()


async def drive(one, requests: int, in_flight: int) -> tuple[float, int, int]:
    """CPU seconds per request of ``requests`` calls of ``one`` at ``in_flight`` at once, after a
    warm-up round that opens the connections (and does their handshakes); and the requests sent
    and answered 200, the warm-up's included."""
    answered = sent = 0

    async def worker(count: int):
        nonlocal answered, sent
        for _ in range(count):
            sent += 1
            ok = await one()  # not "answered += await one()": that reads answered before the await
            answered += ok

    await asyncio.gather(*(worker(2) for _ in range(in_flight)))
    cpu = time.process_time()
    await asyncio.gather(*(worker(requests // in_flight) for _ in range(in_flight)))
    return (time.process_time() - cpu) / (requests // in_flight * in_flight), sent, answered


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plain", action="store_true", help="plain HTTP rather than TLS")
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--in-flight", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--serve", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(*args.serve)
        return
    with tempfile.TemporaryDirectory() as folder:
        ca, cert, key = make_certificates(Path(folder))
        port_file = Path(folder) / "port"
        server = subprocess.Popen(
            [sys.executable, __file__, "--serve", str(port_file), "" if args.plain else str(cert), str(key)]
        )
        try:
            for _ in range(100):
                if port_file.exists() and port_file.read_text():
                    break
                time.sleep(0.1)
            url = f"{'http' if args.plain else 'https'}://127.0.0.1:{port_file.read_text()}"
            context = ssl.create_default_context(cafile=str(ca))
            figures: dict[str, list[float]] = {"aiohttp": [], "pod_client": []}
            sent = dict.fromkeys(figures, 0)
            answered = dict.fromkeys(figures, 0)
            for _ in range(args.rounds):
                for name, run in (("aiohttp", with_aiohttp), ("pod_client", with_pod_client)):
                    seconds, round_sent, round_answered = asyncio.run(run(url, context, args.requests, args.in_flight))
                    figures[name].append(round(seconds * 1e6, 1))
                    sent[name] += round_sent
                    answered[name] += round_answered
                    print(f"{name:>10}: {seconds * 1e6:6.1f} µs CPU per request ({url.split(':')[0]})", flush=True)
        finally:
            server.terminate()
            server.wait()
    best = {name: min(values) for name, values in figures.items()}
    goal = {
        # Counted: each client had every request it sent answered 200.
        "every_request_answered": all(answered[name] == sent[name] > 0 for name in figures),
        # This machine's CPU time: in the JSON, not asserted by CI.
        "pod_client_cheaper": best["pod_client"] <= best["aiohttp"],
    }
    print(f"best of {args.rounds}: aiohttp {best['aiohttp']} µs, PodClient {best['pod_client']} µs per request")
    print("answered 200: " + ", ".join(f"{name} {answered[name]}/{sent[name]}" for name in figures))
    print(json.dumps({"benchmark": "pods_client", "scheme": url.split(":")[0], "requests": args.requests,
                      "in_flight": args.in_flight, "us_cpu_per_request": figures, "best": best, "sent": sent,
                      "answered": answered, "goal": goal, "goal_met": all(goal.values())}))  # fmt: skip


if __name__ == "__main__":
    main()
