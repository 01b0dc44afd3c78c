"""HTTP face of the simulator: RunPod's GraphQL endpoint, the control API, and every virtual pod.

A virtual pod answers under a host of its own, ``{pod_id}-{port}.proxy.localhost`` (at the
simulator's port), routed by the Host header as RunPod's proxy routes
``{pod_id}-{port}.proxy.runpod.net``: ``GET /healthz``, ``GET /v1/models``, ``PUT
/v1/documents/{sha256}``, ``POST /v1/ocr``. The same routes are served under ``/pods/{pod_id}`` of
the simulator's own host, as one gateway in front of every pod would serve them.

Routes of the simulator's own host:
  POST /graphql                      what the runpod SDK talks to
  GET  /sim/stats                    counters for tests and benchmarks
  GET  /sim/pods                     the virtual pods
  GET  /sim/pods/{id}/documents      what one virtual pod's document cache holds, oldest use first
  GET|POST /sim/faults               the injected faults ({"faults": [...], "append": false})
  POST /sim/capacity                 {"gpu": id, "cloud": "SECURE", "data_center": "EU-RO-1", "free": 3}
  POST /sim/preempt                  {"pod_id": id, "terminated": false}: the provider takes an interruptible
                                     pod back now ("Outbid"; ``terminated``: on the TERMINATED path)
  POST /sim/balance                  {"empty": true}: the balance runs out (every pod stops); false tops up
  POST /sim/stop                     {"pod_id": id, "cause": "host"}: RunPod stops a pod itself
  POST /v1/pods                      RunPod's REST create (``interruptible: true`` for a spot pod)
  GET  /pods/{id}/healthz            the pod server API of one virtual pod, same JSON as podserver
  GET  /pods/{id}/v1/models          (the pod's POD_TOKEN as a bearer token, when its env has one)
  PUT  /pods/{id}/v1/documents/{sha256}   its document cache (LRU under document_cache_bytes)
  POST /pods/{id}/v1/ocr             a cached document's page (JSON), or a raw image body

Length: a test and benchmark tool, not the product; every route RunPod and its pods answer, in one place.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import io
import json
import re
from collections import OrderedDict
from http import HTTPStatus
from typing import Any

from aiohttp import web
from pydantic import ValidationError

from runpodsim import graphql
from runpodsim.config import SOMETHING_WENT_WRONG_MESSAGE, FaultList, SimConfig
from runpodsim.farm import FAILED, LOADING, READY, Farm, Verdict, VirtualPod
from runpodsim.schema import RUNPOD_SCHEMA

FARM_KEY = web.AppKey("farm", Farm)
ENGINE = "simulated"
# Pods' own hosts are {pod_id}-{port} under this domain (names under .localhost are loopback: RFC 6761).
POD_DOMAIN = "proxy.localhost"
# Pages of each document received, by sha256, for every virtual pod of this process: a real pod
# counts a document on its own machine, in parallel with the rest of the fleet; here 256 pods
# share one core, where counting a 40,960-page PDF 256 times (25 ms each) stalled every pod's
# first round by seconds (bench/dispatch.py at 256 pods). The body is still read and hashed per pod.
PAGE_COUNTS_KEPT = 1024
_page_counts: dict[str, int | None] = {}
# The last bodies whose sha256 was checked, up to VERIFIED_BYTES_KEPT: a body equal to one of them
# byte for byte has its hash, and comparing costs ~1 ms for 5 MB where hashing costs ~8. A real pod
# hashes its own copy on its own CPU; 256 virtual pods hashing theirs on the simulator's one core
# took ~2 s of the first round at 256 pods (bench/dispatch.py). Every body is still read and checked.
VERIFIED_BYTES_KEPT = 64 * 1024 * 1024
_verified: OrderedDict[str, bytes] = OrderedDict()


def make_app(config: SimConfig) -> web.Application:
    # Pages can be tens of MB; the size check against max_page_bytes gives the 413.
    client_max_size = max(config.max_page_bytes, config.max_document_bytes) + 1024 * 1024
    app = web.Application(client_max_size=client_max_size)
    app[FARM_KEY] = Farm(config)
    # Each pod under a host of its own (the Host header names it, as at RunPod's proxy).
    pods = web.Application(client_max_size=client_max_size)
    pods[FARM_KEY] = app[FARM_KEY]
    pods.add_routes(
        [
            web.get("/healthz", pod_healthz),
            web.get("/v1/models", pod_models),
            web.post("/v1/ocr", pod_ocr),
            web.put("/v1/documents/{sha256}", pod_put_document),
        ]
    )
    app.add_domain(f"*.{POD_DOMAIN}", pods)
    app.add_routes(
        [
            web.post("/graphql", graphql_endpoint),
            web.post("/v1/pods", rest_create_endpoint),
            web.post("/sim/balance", sim_set_balance),
            web.post("/sim/stop", sim_stop),
            web.get("/sim/stats", sim_stats),
            web.get("/sim/pods", sim_pods),
            web.get("/sim/pods/{pod_id}/documents", sim_pod_documents),
            web.get("/sim/faults", sim_faults),
            web.post("/sim/faults", sim_set_faults),
            web.post("/sim/capacity", sim_set_capacity),
            web.post("/sim/preempt", sim_preempt),
            web.get("/pods/{pod_id}/healthz", pod_healthz),
            web.get("/pods/{pod_id}/v1/models", pod_models),
            web.post("/pods/{pod_id}/v1/ocr", pod_ocr),
            web.put("/pods/{pod_id}/v1/documents/{sha256}", pod_put_document),
        ]
    )
    return app


def _errors(message: str, status: int = 200, code: str | None = None, headers: dict | None = None) -> web.Response:
    error: dict[str, Any] = {"message": message}
    if code is not None:
        error["extensions"] = {"code": code}
    return web.json_response({"errors": [error]}, status=status, headers=headers)


async def graphql_endpoint(request: web.Request) -> web.Response:
    farm = request.app[FARM_KEY]
    operation: graphql.Operation | None = None
    problem: str | None = None
    try:
        payload = await request.json()
        query = payload.get("query") if isinstance(payload, dict) else None
        if not isinstance(query, str):
            raise graphql.GraphQLError("Must provide query string.")
        operation = graphql.parse(query)
    except json.JSONDecodeError:
        problem = "POST body sent invalid JSON."
    except graphql.GraphQLError as exc:
        problem = str(exc)
    farm.count_call(operation)

    root_field = operation.selections[0].name if operation else None
    verdict = farm.screen(root_field, request.headers.get("Authorization"))
    if verdict.delay_s:
        await asyncio.sleep(verdict.delay_s)
    if verdict.status == 401:
        return _errors("Unauthorized", status=401)
    if verdict.status == 429:
        return _rate_limited(verdict)
    if verdict.status >= 400 and not verdict.after_execute:
        return _server_error(verdict.status, verdict.body)

    if problem is not None or operation is None:
        return _errors(problem or "Must provide query string.")
    if verdict.error is not None:
        return _errors(verdict.error[0], code=verdict.error[1])
    try:
        graphql.validate(operation, RUNPOD_SCHEMA)
        data = farm.execute(operation)
    except graphql.GraphQLError as exc:
        return _errors(str(exc), code=exc.code)
    if verdict.delay_after_s:
        await asyncio.sleep(verdict.delay_after_s)
    if verdict.status >= 400:
        return _server_error(verdict.status, verdict.body)
    return web.json_response({"data": data})


def _rate_limited(verdict: Verdict) -> web.Response:
    headers = {"Retry-After": f"{verdict.retry_after_s:g}"} if verdict.retry_after_s is not None else {}
    if verdict.body == "json":
        return _errors("Too many requests. Please slow down.", status=429, code="RATE_LIMITED", headers=headers)
    text = "<html><head><title>429 Too Many Requests</title></head><body>429 Too Many Requests</body></html>"
    return web.Response(status=429, text=text, content_type="text/html", headers=headers)


async def rest_create_endpoint(request: web.Request) -> web.Response:
    """RunPod's REST create, ``POST /v1/pods``: the pod as JSON, or ``{"error": ...}``."""
    farm = request.app[FARM_KEY]
    verdict = farm.screen("restCreate", request.headers.get("Authorization"))
    if verdict.status == 401:
        return web.json_response({"error": "Unauthorized"}, status=401)
    if verdict.status == 429:
        return _rate_limited(verdict)
    if verdict.status >= 400:
        return _server_error(verdict.status, verdict.body)
    try:
        body = await request.json()
        if not isinstance(body, dict):
            raise ValueError("the body must be a JSON object")
        farm.preempt_due()
        pod = farm.rest_create(body)
    except (json.JSONDecodeError, ValueError) as exc:
        return web.json_response({"error": f"invalid body: {exc}"}, status=400)
    except graphql.GraphQLError as exc:
        return web.json_response({"error": str(exc), **({"code": exc.code} if exc.code else {})}, status=400)
    return web.json_response(pod, status=201)


# What Cloudflare (in front of RunPod's proxy) answers when the origin took over 100 s.
CLOUDFLARE_524 = (
    "<!DOCTYPE html><html><head><title>proxy.runpod.net | 524: A timeout occurred</title></head>"
    "<body><h1>A timeout occurred</h1><p>Error code 524</p></body></html>"
)


def _server_error(status: int, body: str) -> web.Response:
    if body == "json":
        return _errors(SOMETHING_WENT_WRONG_MESSAGE, status=status)
    phrase = HTTPStatus(status).phrase if status in HTTPStatus._value2member_map_ else "Server Error"
    return web.Response(status=status, text=f"<html><body>{status} {phrase}</body></html>", content_type="text/html")


# -- control API ---------------------------------------------------------------------------------


async def sim_stats(request: web.Request) -> web.Response:
    return web.json_response(request.app[FARM_KEY].summary())


async def sim_pods(request: web.Request) -> web.Response:
    farm = request.app[FARM_KEY]
    return web.json_response({"pods": [farm.pod_summary(pod) for pod in farm.pods.values()]})


async def sim_pod_documents(request: web.Request) -> web.Response:
    pod = request.app[FARM_KEY].pods.get(request.match_info["pod_id"])
    if pod is None:
        return web.json_response({"error": "no such pod"}, status=404)
    documents = [{"sha256": sha256, "bytes": d.size, "pages": d.pages} for sha256, d in pod.documents.items()]
    return web.json_response({"documents": documents})


async def sim_faults(request: web.Request) -> web.Response:
    return web.json_response({"faults": [fault.model_dump() for fault in request.app[FARM_KEY].faults]})


async def sim_set_faults(request: web.Request) -> web.Response:
    farm = request.app[FARM_KEY]
    try:
        payload = await request.json()
        append = bool(payload.pop("append", False)) if isinstance(payload, dict) else False
        faults = FaultList.model_validate(payload).faults
    except (json.JSONDecodeError, ValidationError) as exc:
        return web.json_response({"error": str(exc)}, status=400)
    farm.set_faults(faults, append=append)
    return await sim_faults(request)


async def sim_set_capacity(request: web.Request) -> web.Response:
    farm = request.app[FARM_KEY]
    try:
        payload = await request.json()
        key = (str(payload["gpu"]), str(payload["cloud"]), str(payload["data_center"]))
        free = int(payload["free"])
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        return web.json_response({"error": f"expected gpu, cloud, data_center, free: {exc}"}, status=400)
    if key[0] not in farm.gpus or key[1] not in ("SECURE", "COMMUNITY") or free < 0:
        return web.json_response({"error": "unknown gpu or cloud, or negative count"}, status=400)
    farm.free[key] = free
    return web.json_response({"free": free})


async def sim_set_balance(request: web.Request) -> web.Response:
    """``{"empty": true}``: the account's balance runs out (every pod stops); false tops it up."""
    farm = request.app[FARM_KEY]
    try:
        empty = (await request.json())["empty"]
        if not isinstance(empty, bool):
            raise TypeError("empty must be true or false")
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        return web.json_response({"error": f"expected empty: {exc}"}, status=400)
    farm.set_balance_empty(empty)
    return web.json_response({"empty": empty})


STOP_EVENTS = {
    "host": "Exited by Runpod",
    "image": "Exited by Runpod",
    "balance": "Exited by RunPod: Insufficient balance",
}


async def sim_stop(request: web.Request) -> web.Response:
    """``{"pod_id": id, "cause": "host"}``: RunPod stops a pod itself ("Exited by Runpod")."""
    farm = request.app[FARM_KEY]
    try:
        payload = await request.json()
        pod, event = farm.pods.get(str(payload["pod_id"])), STOP_EVENTS[payload.get("cause", "host")]
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        return web.json_response({"error": f"expected pod_id and a cause of {sorted(STOP_EVENTS)}: {exc}"}, status=400)
    if pod is None:
        return web.json_response({"error": "no such pod"}, status=404)
    farm.stop(pod, event)
    return web.json_response(farm.pod_summary(pod))


async def sim_preempt(request: web.Request) -> web.Response:
    farm = request.app[FARM_KEY]
    try:
        payload = await request.json()
        pod_id = str(payload["pod_id"])
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        return web.json_response({"error": f"expected pod_id: {exc}"}, status=400)
    pod = farm.pods.get(pod_id)
    if pod is None or not pod.interruptible:
        return web.json_response({"error": "no such interruptible pod"}, status=404)
    terminated = payload.get("terminated") if isinstance(payload, dict) else None
    farm.preempt(pod, terminated=bool(terminated) if terminated is not None else None)
    return web.json_response(farm.pod_summary(pod))


# -- virtual pods --------------------------------------------------------------------------------


def _pod_error(status: int, message: str, headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response({"error": message}, status=status, headers=headers)


def _addressed(request: web.Request) -> tuple[str, str | None]:
    """The pod id this request is for and the pod's port it names: from the path under the gateway
    (``/pods/{pod_id}``, no port), else from the host, ``{pod_id}-{port}.proxy.localhost``."""
    pod_id = request.match_info.get("pod_id")
    if pod_id is not None:
        return pod_id, None
    pod_id, _, port = request.host.partition(".")[0].rpartition("-")
    return pod_id, port


def _serving_pod(request: web.Request) -> tuple[Farm, VirtualPod, None] | tuple[Farm, None, web.Response]:
    """The pod behind this URL, or the response RunPod's proxy would give instead."""
    farm = request.app[FARM_KEY]
    pod_id, port = _addressed(request)
    pod = farm.pods.get(pod_id)
    if pod is None or (port is not None and not farm.serves_http(pod, port)):
        return farm, None, _pod_error(404, "no such pod")
    if not farm.runtime_up(pod):
        return farm, None, _pod_error(502, "pod is not running")
    return farm, pod, None


def _authorized(request: web.Request, farm: Farm, pod: VirtualPod) -> web.Response | None:
    """None if the request carries the pod's token (or the pod has none); else the 401, decided
    from the headers alone, before any body is read."""
    if not pod.token:
        farm.touch(pod)
        return None
    if _carries_token(request, pod):
        farm.touch(pod)
        return None
    farm.stats["pod_auth_failures"] += 1
    return _pod_error(401, "missing or wrong token")


def _carries_token(request: web.Request, pod: VirtualPod) -> bool:
    sent = request.headers.get("Authorization", "")
    return hmac.compare_digest(sent.encode(), f"Bearer {pod.token}".encode())


def _pod_for_api(request: web.Request) -> tuple[Farm, VirtualPod, None] | tuple[Farm, None, web.Response]:
    farm, pod, refusal = _serving_pod(request)
    if refusal is None:
        refusal = _authorized(request, farm, pod)
    return (farm, None, refusal) if refusal is not None else (farm, pod, None)


async def pod_healthz(request: web.Request) -> web.Response:
    farm, pod, refusal = _serving_pod(request)
    if refusal is not None:
        return refusal
    if not pod.token or _carries_token(request, pod):  # asked with the token: the control plane
        farm.touch(pod)
    state = farm.model_state(pod)
    if state == READY:
        return web.json_response({"status": "ok"})
    if state == FAILED:
        return web.json_response({"status": "failed", "error": "simulated engine failure"}, status=503)
    return web.json_response({"status": "loading"}, status=503)


async def pod_models(request: web.Request) -> web.Response:
    farm, pod, refusal = _pod_for_api(request)
    if refusal is not None:
        return refusal
    ready = farm.model_state(pod) == READY
    return web.json_response(
        {
            "engine": ENGINE,
            "version": "sim-1" if ready else "",
            "languages": list(farm.config.languages) if ready else [],
            "gives": ["boxes", "confidence"],
            "lanes": pod.lanes,
            "busy": pod.busy,
            "ready": ready,
            "name": pod.name,
            "pages_done": pod.pages_done,
            "pages_failed": pod.pages_failed,
            "documents": {
                "count": len(pod.documents),
                "bytes": pod.cached_bytes,
                "capacity_bytes": farm.config.document_cache_bytes,
            },
        }
    )


SHA256_RE = re.compile(r"^[0-9a-f]{64}$")


async def pod_put_document(request: web.Request) -> web.Response:
    farm, pod, refusal = _pod_for_api(request)
    if refusal is not None:
        return refusal
    sha256 = request.match_info["sha256"]
    if not SHA256_RE.match(sha256):
        return _pod_error(400, "a document is named by its sha256: 64 lowercase hex characters")
    length = request.content_length
    if length is None:
        return _pod_error(400, "missing or invalid Content-Length")
    if length > farm.config.max_document_bytes:
        return _pod_error(413, f"document of {length} bytes exceeds limit of {farm.config.max_document_bytes}")
    # Counted as it arrives, kept as the chunks it came in: request.read() copied the whole body
    # twice (into a bytearray, then bytes), and a virtual pod shares the cores with the control
    # plane it stands in for (bench/ingest.py).
    chunks, size = [], 0
    async for chunk in request.content.iter_any():
        chunks.append(chunk)
        size += len(chunk)
    farm.stats["document_bytes_received"] += size
    farm.stats["bytes_to_pods"] += size
    if not _body_is_named_by(sha256, chunks):
        return _pod_error(400, "the body's sha256 is not its name")
    if sha256 not in _page_counts:
        if len(_page_counts) >= PAGE_COUNTS_KEPT:
            del _page_counts[next(iter(_page_counts))]
        _page_counts[sha256] = _count_pages(chunks)
    pages = _page_counts[sha256]
    if pages is None:
        return _pod_error(415, "not a PDF, PNG, JPEG or TIFF document")
    new = pod.cache(sha256, size, pages, farm.config.document_cache_bytes)
    farm.stats["documents_received" if new else "documents_already_cached"] += 1
    return web.json_response({"sha256": sha256, "bytes": size, "pages": pages}, status=201 if new else 200)


def _body_is_named_by(sha256: str, chunks: list[bytes]) -> bool:
    """Whether the body's sha256 is ``sha256``: the same bytes as a body already checked, or hashed."""
    known = _verified.get(sha256)
    if known is not None:
        _verified.move_to_end(sha256)
        return b"".join(chunks) == known
    digest = hashlib.sha256()
    for chunk in chunks:
        digest.update(chunk)
    if digest.hexdigest() != sha256:
        return False
    body = b"".join(chunks)
    if len(body) <= VERIFIED_BYTES_KEPT:
        _verified[sha256] = body
        while sum(map(len, _verified.values())) > VERIFIED_BYTES_KEPT:
            _verified.popitem(last=False)
    return True


def _count_pages(chunks: list[bytes]) -> int | None:
    """Pages of a document, as the pod server counts them (PDFium for a PDF, frames for a TIFF),
    from the chunks it arrived in (joined only for a reader that needs the whole document)."""
    head = b""
    for chunk in chunks:
        head += chunk[: 8 - len(head)]
        if len(head) == 8:
            break
    if head.startswith(b"%PDF-"):
        import pypdfium2 as pdfium

        try:
            pdf = pdfium.PdfDocument(b"".join(chunks))
        except pdfium.PdfiumError:
            return None
        try:
            return len(pdf)
        finally:
            pdf.close()
    if head.startswith((b"\x89PNG", b"\xff\xd8\xff")):
        return 1
    if head.startswith((b"II*\x00", b"MM\x00*")):
        from PIL import Image

        try:
            with Image.open(io.BytesIO(b"".join(chunks))) as image:
                return getattr(image, "n_frames", 1)
        except Exception:
            return None
    return None


async def pod_ocr(request: web.Request) -> web.Response:
    farm, pod, refusal = _pod_for_api(request)
    if refusal is not None:
        return refusal
    state = farm.model_state(pod)
    if state != READY:
        return _pod_error(503, f"engine {state}", {"Retry-After": "1"} if state == LOADING else None)
    if farm.proxy_cuts_page():
        return web.Response(status=524, text=CLOUDFLARE_524, content_type="text/html")
    if request.content_type == "application/json":
        return await _ocr_document_page(request, farm, pod)
    lang = request.query.get("lang", "eng")
    unknown = [part for part in lang.split("+") if part not in farm.config.languages]
    if unknown:
        return _pod_error(400, f"unknown language(s) {unknown!r}; installed: {farm.config.languages}")
    length = request.content_length
    if length is None:
        return _pod_error(400, "missing or invalid Content-Length")
    if length == 0:
        return _pod_error(400, "empty body")
    if length > farm.config.max_page_bytes:
        return _pod_error(413, f"body of {length} bytes exceeds limit of {farm.config.max_page_bytes}")
    # Refuse before reading the upload, as the pod server does, so a busy pod costs the client nothing.
    if pod.busy >= pod.lanes:
        farm.stats["ocr_busy_answers"] += 1
        return _pod_error(429, "all lanes busy", {"Retry-After": "1"})
    pod.busy += 1
    try:
        body = await request.read()
        farm.stats["image_bytes_received"] += len(body)
        farm.stats["bytes_to_pods"] += len(body)
        await asyncio.sleep(farm.config.page_latency_s)
    finally:
        pod.busy -= 1
    if not farm.runtime_up(pod):
        return _preempted_meanwhile(farm)
    pod.pages_done += 1
    farm.stats["ocr_pages"] += 1
    return web.json_response(_page_result(body, farm.config.page_latency_s))


async def _ocr_document_page(request: web.Request, farm: Farm, pod: VirtualPod) -> web.Response:
    """``{"document": sha256, "page": n, "dpi": d, "languages": "eng"}``: 409 when the pod does not hold it."""
    try:
        payload = await request.json()
        sha256, number = str(payload["document"]), payload["page"]
        dpi, languages = payload.get("dpi", 200), str(payload.get("languages") or "eng")
    except (ValueError, KeyError, TypeError):
        return _pod_error(400, "expected JSON {document, page, dpi, languages}")
    unknown = [part for part in languages.split("+") if part not in farm.config.languages]
    if unknown:
        return _pod_error(400, f"unknown language(s) {unknown!r}; installed: {farm.config.languages}")
    if not isinstance(dpi, int) or not 36 <= dpi <= 600:
        return _pod_error(400, "dpi must be an integer in [36, 600]")
    document = pod.cached(sha256)
    if document is None:
        farm.stats["ocr_not_cached_answers"] += 1
        return web.json_response({"error": "document not cached", "document": sha256}, status=409)
    if not isinstance(number, int) or not 1 <= number <= document.pages:
        return _pod_error(400, f"page {number!r} is out of range: the document has {document.pages} pages")
    if pod.busy >= pod.lanes:
        farm.stats["ocr_busy_answers"] += 1
        return _pod_error(429, "all lanes busy", {"Retry-After": "1"})
    pod.busy += 1
    document.in_use += 1
    try:
        await asyncio.sleep(farm.config.page_latency_s)
    finally:
        pod.busy -= 1
        document.in_use -= 1
    if not farm.runtime_up(pod):
        return _preempted_meanwhile(farm)
    pod.pages_done += 1
    farm.stats["ocr_pages"] += 1
    result = _page_result(f"{sha256}:{number}".encode(), farm.config.page_latency_s)
    result["render_seconds"] = 0.0
    return web.json_response(result)


def _preempted_meanwhile(farm: Farm) -> web.Response:
    """The pod was taken back while it read the page: its work is lost, as the proxy says."""
    farm.stats["ocr_pages_lost_to_preemption"] += 1
    return _pod_error(502, "pod is not running")


def _page_result(body: bytes, seconds: float) -> dict[str, Any]:
    text = f"page {hashlib.sha1(body).hexdigest()[:12]}"
    return {
        "text": text,
        "lines": [{"text": text, "bbox": [0, 0, 100, 20], "confidence": 99.0}],
        "confidence": 99.0,
        "width": 0,
        "height": 0,
        "engine": ENGINE,
        "markdown": False,
        "seconds": round(seconds, 3),
    }
