"""Ingest: the real path end to end, documents in through the API, pages out to simulator pods.

    .venv/bin/python bench/ingest.py [--database-url postgres://...] [--pdfs 200 --pages-per-pdf 10]
        [--images 500 --page-kb 120] [--docs-per-job 10 --clients 4] [--pods 8 --lanes 16] [--pdf]

Thousands of pages arrive as multi-page scanned PDFs (a JPEG per page) and as PNG and JPEG
images, every document unique (its own sha256), posted as multipart ``POST /v1/jobs`` requests
(``--docs-per-job`` documents each, ``--clients`` at a time) to a real daphne front. The real
workers (``manage.py workers``) split them (they count pages and check limits; nothing is
rendered) and dispatch every page to ``--pods`` virtual pods of the RunPod simulator that answer
at once (zero latency), each pod holding its own token. The pods ask for each document once
(``PUT /v1/documents/{sha256}``) and are asked for its pages by hash.

Prints:
- pages/s end to end: from the first submit to the last result stored;
- control-plane CPU per page: the CPU seconds of the front and the workers (every process of
  theirs: bench/control_plane.py's CpuMeter) over the same span, per page;
- bytes sent to pods per page against the documents' own bytes per page (the simulator counts
  every body it is sent: documents and images);
- the front's upload rate: bytes of documents accepted ÷ the time from the first submit to the
  last submission answered;
- pages lost or read twice (the simulator's page count against the pages stored);
- with ``--pdf`` (every job asks for searchable PDFs): PDFs built, how long after the last page
  the last one was, and the outputs workers' CPU, apart from the control plane's (their class
  runs at a lower CPU priority: the pages' figures above are what a build leaves them).

The closing JSON line's "goal" names each goal: counted ones, every_submission_accepted,
nothing_lost, nothing_read_twice and bytes_to_pods_ratio (<= 1.1); and on this 2-core
machine pages_per_s (>= 500), control_plane_cpu_ms_per_page (<= 2.5) and upload_mb_s
(>= 100), which CI does not assert; with ``--pdf``, every_pdf_built (counted). CI's size
(tests/bench/test_ingest.py):

    .venv/bin/python bench/ingest.py --pdfs 10 --pages-per-pdf 10 --images 20 --pods 2 --lanes 8 --pdf
"""

from __future__ import annotations

import argparse
import io
import json
import os
import queue
import random
import struct
import sys
import threading
import time
import uuid
import zlib

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench._cpu import CEILING_GOAL, per_unit, within_ceiling
from bench._setup import bench_session
from bench.control_plane import API_KEY, CpuMeter, sim_get
from tools.processes import Children, child_env, start_front, start_workers

GPU = "INGEST-GPU"
# Issue 37's goals on an idle 2-core machine, with no PDF asked for (with --pdf, pages/s is to stay
# at 0.9x that: bench/compare.py shows the pair).
GOALS = {"pages_per_s": 500.0, "control_plane_cpu_ms_per_page": 2.5, "bytes_to_pods_ratio": 1.1, "upload_mb_s": 100.0}
# What CI asserts at its small size (bench/_cpu.py): ~3x the 5.1 ms a page measured there (its
# start-up costs weigh on 120 pages), on a machine shared with other work.
CPU_CEILING_MS_PER_PAGE = 16.0


def sim_config(args) -> dict:
    return {
        "api_key": API_KEY,
        "boot_delay_s": 0.0,
        "model_load_s": 0.0,
        "page_latency_s": 0.0,
        "default_lanes": args.lanes,
        "gpu_types": [{"id": GPU, "displayName": "ingest bench", "memoryInGb": 48, "securePrice": 0.5,
                       "capacity": {"SECURE": {"DC-1": args.pods}}}],
    }  # fmt: skip


# --- documents --------------------------------------------------------------------------------------


def scanned_page(seed: int, kb: int) -> bytes:
    """A grey page of text-like strokes at 200 dpi, JPEG-encoded to about ``kb`` kilobytes."""
    from PIL import Image, ImageDraw

    rng = random.Random(seed)
    image = Image.new("L", (1700, 2200), 255)
    draw = ImageDraw.Draw(image)
    for y in range(150, 2050, 40):
        x = 150
        while x < 1550:
            width = rng.randint(20, 120)
            draw.rectangle([x, y, x + width, y + 22], fill=rng.randint(0, 90))
            x += width + rng.randint(10, 25)
    quality = 95
    while True:
        out = io.BytesIO()
        image.save(out, format="JPEG", quality=quality)
        if out.tell() <= kb * 1024 or quality <= 20:
            return out.getvalue()
        quality -= 10


def pdf_template(pages: int, kb: int) -> bytes:
    from PIL import Image

    images = [Image.open(io.BytesIO(scanned_page(n, kb))) for n in range(pages)]
    out = io.BytesIO()
    images[0].save(out, format="PDF", save_all=True, append_images=images[1:], resolution=200.0)
    return out.getvalue()


def unique_pdf(template: bytes, n: int) -> bytes:
    # A comment after %%EOF: a PDF of its own (its own sha256) that reads the same.
    return template + f"\n% ingest document {n} {uuid.uuid4().hex}\n".encode()


def unique_png(template: bytes, n: int) -> bytes:
    data = b"Comment\0" + f"ingest image {n} {uuid.uuid4().hex}".encode()
    chunk = struct.pack(">I", len(data)) + b"tEXt" + data + struct.pack(">I", zlib.crc32(b"tEXt" + data))
    iend = template.rindex(b"IEND") - 4
    return template[:iend] + chunk + template[iend:]


def unique_jpeg(template: bytes, n: int) -> bytes:
    comment = f"ingest image {n} {uuid.uuid4().hex}".encode()
    return template[:2] + b"\xff\xfe" + struct.pack(">H", len(comment) + 2) + comment + template[2:]


def make_documents(args) -> list[tuple[str, bytes, int]]:
    """(name, bytes, pages) of every document, shuffled: PDFs and images mixed in each job."""
    from PIL import Image

    template = pdf_template(args.pages_per_pdf, args.page_kb)
    page = scanned_page(999, args.page_kb)
    png = io.BytesIO()
    Image.open(io.BytesIO(page)).save(png, format="PNG", compress_level=1)
    png_template = png.getvalue()
    documents = [(f"scan-{n}.pdf", unique_pdf(template, n), args.pages_per_pdf) for n in range(args.pdfs)]
    for n in range(args.images):
        if n % 2:
            documents.append((f"photo-{n}.jpg", unique_jpeg(page, n), 1))
        else:
            documents.append((f"page-{n}.png", unique_png(png_template, n), 1))
    random.Random(1).shuffle(documents)
    return documents


# --- the run ----------------------------------------------------------------------------------------


def add_document_options(parser: argparse.ArgumentParser) -> None:
    """The documents made and how they are submitted (shared with bench/uploads.py)."""
    parser.add_argument("--pdfs", type=int, default=200, help="multi-page scanned PDFs")
    parser.add_argument("--pages-per-pdf", type=int, default=10)
    parser.add_argument("--images", type=int, default=500, help="single-page images (PNG and JPEG, half each)")
    parser.add_argument("--page-kb", type=int, default=120, help="about this many KB per scanned page (JPEG)")
    parser.add_argument("--docs-per-job", type=int, default=10)
    parser.add_argument("--clients", type=int, default=4, help="submissions in flight at once")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_document_options(parser)
    parser.add_argument("--pods", type=int, default=8)
    parser.add_argument("--lanes", type=int, default=16)
    parser.add_argument("--q-workers", type=int, default=2, help="short-task workers (they split)")
    parser.add_argument("--max-seconds", type=float, default=600, help="give up after this long")
    parser.add_argument("--pdf", action="store_true",
                        help="every job asks for searchable PDFs (searchable_pdf): pages/s while they are built "
                             "by the outputs workers, then the wait until every one is")  # fmt: skip
    parser.add_argument("--database-url", default=os.environ.get("DATABASE_URL", ""))
    args = parser.parse_args()
    with bench_session("ingest", database_url=args.database_url, simulator=sim_config(args), api_key=API_KEY) as (
        children,
        url,
    ):
        run(args, children, url)


def ready_pods(args, sim_url: str):
    """``--pods`` virtual pods, created through the RunPod provider with their tokens in their
    environment (as a boot passes them), joined ready."""
    from concurrent.futures import ThreadPoolExecutor

    from django.utils import timezone

    from pods.models import Pod, Pool, new_pod_token, pod_name
    from pods.providers.base import Offer, PodSpec
    from pods.providers.runpod import RunPodProvider

    pool = Pool.objects.create(
        key="ingest", provider="runpod", min_pods=args.pods, max_pods=args.pods, lanes_per_pod=args.lanes,
        max_parallel_boots=1, idle_seconds=3600,
        config={"image": "ghcr.io/example/fleetadmin-pod:1",
                "candidates": [{"gpu_types": [GPU], "cloud_type": "SECURE", "data_centers": ["DC-1"]}]},
    )  # fmt: skip
    provider = RunPodProvider()
    offer = Offer(GPU, "SECURE", "DC-1")
    tokens = {pod_name(pool, uuid.uuid4().hex[:8]): new_pod_token() for _ in range(args.pods)}

    def create(name: str):
        spec = PodSpec(name=name, lanes=args.lanes, offer=offer, image="img:1", env={"POD_TOKEN": tokens[name]})
        return provider.create(spec)

    with ThreadPoolExecutor(8) as pool_threads:
        created = list(pool_threads.map(create, tokens))
    now = timezone.now()
    Pod.objects.bulk_create(
        [
            Pod(pool=pool, name=item.name, provider_id=item.provider_id, state=Pod.State.READY, lanes=args.lanes,
                base_url=f"{sim_url}/pods/{item.provider_id}", gpu_type=GPU, cloud_type="SECURE", data_center="DC-1",
                cost_per_hr=item.cost_per_hr, billed_from=now, ready_at=now, last_busy_at=now,
                token=tokens[item.name])
            for item in created
        ]
    )  # fmt: skip
    return pool


def submit_all(
    front_url: str, token: str, jobs: list[list[tuple[str, bytes, int]]], clients: int, *, pdf: bool = False
) -> dict:
    """Post every job, ``clients`` at a time (``pdf``: each asks for searchable PDFs); when the
    first went out and the last was answered."""
    fields = {"pool": "ingest", **({"searchable_pdf": "true"} if pdf else {})}
    import httpx

    work: queue.Queue = queue.Queue()
    for job in jobs:
        work.put(job)
    answers: list[tuple[int, str]] = []
    lock = threading.Lock()

    def client() -> None:
        with httpx.Client(base_url=front_url, headers={"Authorization": f"Bearer {token}"}, timeout=120) as http:
            while True:
                try:
                    job = work.get_nowait()
                except queue.Empty:
                    return
                files = [("files", (name, data, "application/octet-stream")) for name, data, _ in job]
                response = http.post("/v1/jobs", files=files, data=fields)
                with lock:
                    answers.append((response.status_code, response.text[:300]))

    threads = [threading.Thread(target=client, name=f"client-{n}") for n in range(clients)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return {"seconds": time.monotonic() - started, "answers": answers}


def settle(meter: CpuMeter, seconds: float = 60.0) -> None:
    """Wait until the workers' clusters are up and quiet: their start-up CPU stays out of the figures."""
    deadline = time.monotonic() + seconds
    time.sleep(2.0)
    before = meter.read()[0].get("qcluster", 0.0)
    while time.monotonic() < deadline:
        time.sleep(1.0)
        now = meter.read()[0].get("qcluster", 0.0)
        if now - before < 0.1:
            return
        before = now


def outputs_roles() -> dict[int, str]:
    """{pid: "outputs"} for every process of the outputs' cluster (``workers --cluster outputs``
    and the workers it forks, its process group): their CPU is the searchable PDFs', apart from
    the pages' control plane."""
    roles = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if b"workers" in argv and b"--cluster" in argv and argv[argv.index(b"--cluster") + 1 :][:1] == [b"outputs"]:
            roles[int(entry)] = "outputs"
    groups = set(roles)
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat") as f:
                if entry.isdigit() and int(f.read().rsplit(")", 1)[1].split()[2]) in groups:
                    roles[int(entry)] = "outputs"
        except (OSError, ValueError, IndexError):
            continue
    return roles


def wait_for_pdfs(pool, workers, args) -> dict:
    """Wait until every document's searchable PDF is built or failed (``--max-seconds`` at most):
    how many of each, and how long after the last page the last one was."""
    from django.db.models import Count, Max, Q

    from ocrjobs.models import Document, Page, SearchablePdf

    documents = Document.objects.filter(job__pool=pool).count()
    rows = SearchablePdf.objects.filter(document__job__pool=pool)
    started = time.monotonic()
    while True:
        if not workers.alive():
            raise SystemExit(f"the workers exited:\n{workers.tail()}")
        ended = rows.aggregate(built=Count("pk", filter=Q(status=SearchablePdf.Status.BUILT)),
                               failed=Count("pk", filter=Q(status=SearchablePdf.Status.FAILED)))  # fmt: skip
        if ended["built"] + ended["failed"] >= documents or time.monotonic() - started > args.max_seconds:
            break
        time.sleep(0.2)
    last_page = Page.objects.filter(pool=pool).aggregate(last=Max("finished_at"))["last"]
    last_pdf = rows.aggregate(last=Max("updated_at"))["last"]
    after = (last_pdf - last_page).total_seconds() if last_pdf and last_page else None
    return {**ended, "seconds_after_pages": round(after, 2) if after is not None else None}


def run(args, children: Children, sim_url: str) -> None:
    from django.contrib.auth import get_user_model
    from django.db import connection
    from django.db.models import Max, Sum
    from django.utils import timezone

    from accounts.models import ApiToken
    from fleetadmin.schedules import setup_schedules
    from ocrjobs.models import Document, Page

    pool = ready_pods(args, sim_url)
    user, _ = get_user_model().objects.get_or_create(username="ingest")
    token = ApiToken.issue(user=user, name="ingest benchmark", scopes=["read", "submit"])[1]
    documents = make_documents(args)
    pages_total = sum(pages for _, _, pages in documents)
    document_bytes = sum(len(data) for _, data, _ in documents)
    jobs = [documents[i : i + args.docs_per_job] for i in range(0, len(documents), args.docs_per_job)]
    setup_schedules()
    connection.close()
    env = child_env(Q_WORKERS=str(args.q_workers), DISPATCH_MAX_SECONDS="3600")
    front, front_url = start_front(env, children.log_dir, own_session=False)
    children.add(front)
    workers = children.add(start_workers(env, children.log_dir, own_session=False))
    meter = CpuMeter(children)
    settle(meter)
    cpu_before = meter.read(outputs_roles())
    print("submitting", file=sys.stderr, flush=True)  # a profiler attached now sees only the run
    first_submit = timezone.now()
    started = time.monotonic()
    submitted: dict = {}
    submitter = threading.Thread(
        target=lambda: submitted.update(submit_all(front_url, token, jobs, args.clients, pdf=args.pdf))
    )
    submitter.start()
    finished = Page.objects.filter(pool=pool, status__in=Page.FINISHED)
    ended = 0
    while True:
        if not workers.alive():
            raise SystemExit(f"the workers exited:\n{workers.tail()}")
        ended = finished.count()
        if ended >= pages_total:
            break
        if time.monotonic() - started > args.max_seconds:
            print(f"gave up after {args.max_seconds:.0f} s: {ended}/{pages_total} pages ended", file=sys.stderr)
            break
        if submitted and any(status != 201 for status, _ in submitted["answers"]):
            bad = [answer for answer in submitted["answers"] if answer[0] != 201]
            print(f"{len(bad)} submissions refused, e.g. {bad[0]}", file=sys.stderr)
            break
        time.sleep(0.1)
    cpu_after = meter.read(outputs_roles())
    elapsed = time.monotonic() - started
    submitter.join()
    pdfs = wait_for_pdfs(pool, workers, args) if args.pdf else {}
    cpu_pdfs = meter.read(outputs_roles()) if args.pdf else cpu_after

    pages = Page.objects.filter(pool=pool)
    done = pages.filter(status=Page.Status.DONE).count()
    last_result = pages.aggregate(last=Max("finished_at"))["last"]
    span = (last_result - first_submit).total_seconds() if last_result else elapsed
    stored_bytes = Document.objects.filter(job__pool=pool).aggregate(total=Sum("size_bytes"))["total"] or 0
    stats = sim_get(sim_url, "/sim/stats")
    cpu = {name: cpu_after[0].get(name, 0.0) - cpu_before[0].get(name, 0.0) for name in cpu_after[0]}
    # The pages' control plane: the front and every worker class but the outputs' (counted apart).
    control_plane_s = cpu.get("daphne", 0.0) + cpu.get("qcluster", 0.0)
    outputs_s = cpu_pdfs[0].get("outputs", 0.0) - cpu_before[0].get("outputs", 0.0)
    upload_s = submitted["seconds"]
    result = {
        "benchmark": "ingest",
        "database": connection.vendor,
        "documents": len(documents),
        "pdfs": args.pdfs,
        "pages_per_pdf": args.pages_per_pdf,
        "images": args.images,
        "pages": pages_total,
        "pages_done": done,
        "pods": args.pods,
        "lanes_per_pod": args.lanes,
        "clients": args.clients,
        "docs_per_job": args.docs_per_job,
        "seconds": round(span, 2),
        "pages_per_s": round(done / span, 1) if span > 0 else None,
        **per_unit("page", control_plane_s, done, CPU_CEILING_MS_PER_PAGE),
        "cpu_s_by_process": {name: round(seconds, 2) for name, seconds in sorted(cpu.items())},
        "pdf": args.pdf,
        "pdfs_built": pdfs.get("built", 0),
        "pdfs_failed": pdfs.get("failed", 0),
        "pdf_seconds_after_pages": pdfs.get("seconds_after_pages"),
        "outputs_cpu_s": round(outputs_s, 2),
        "outputs_cpu_ms_per_page": round(outputs_s * 1000 / max(done, 1), 2),
        "document_bytes": document_bytes,
        "document_bytes_stored": stored_bytes,
        "document_bytes_per_page": round(document_bytes / max(pages_total, 1)),
        "bytes_to_pods": stats["bytes_to_pods"],
        "bytes_to_pods_per_page": round(stats["bytes_to_pods"] / max(pages_total, 1)),
        "bytes_to_pods_ratio": round(stats["bytes_to_pods"] / document_bytes, 3) if document_bytes else None,
        "documents_put": stats["documents_received"],
        "documents_put_again": stats["documents_already_cached"],
        "not_cached_answers": stats["ocr_not_cached_answers"],
        "upload_seconds": round(upload_s, 2),
        "upload_mb_s": round(document_bytes / upload_s / 1e6, 1) if upload_s else None,
        "pod_pages_read": stats["ocr_pages"],
        "lost": pages_total - done,
        "read_twice": max(0, stats["ocr_pages"] - done),
    }
    accepted = sum(1 for status, _ in submitted["answers"] if status == 201)
    result.update(submissions=len(jobs), submissions_accepted=accepted)
    goal = {
        # Counted: the same on any machine.
        "every_submission_accepted": accepted == len(jobs),
        "nothing_lost": result["lost"] == 0,
        "nothing_read_twice": result["read_twice"] == 0,
        "bytes_to_pods_ratio": result["bytes_to_pods_ratio"] is not None
        and result["bytes_to_pods_ratio"] <= GOALS["bytes_to_pods_ratio"],
        # This machine's speed: in the JSON, not asserted by CI.
        "pages_per_s": bool(result["pages_per_s"]) and result["pages_per_s"] >= GOALS["pages_per_s"],
        CEILING_GOAL: within_ceiling(result),  # CPU time: CI asserts it, at a generous ceiling
        "control_plane_cpu_ms_per_page": result["control_plane_cpu_ms_per_page"] is not None
        and result["control_plane_cpu_ms_per_page"] <= GOALS["control_plane_cpu_ms_per_page"],
        "upload_mb_s": result["upload_mb_s"] is not None and result["upload_mb_s"] >= GOALS["upload_mb_s"],
    }
    if args.pdf:
        goal["every_pdf_built"] = result["pdfs_built"] == len(documents)  # counted
    result.update(goal=goal, goal_met=all(goal.values()))
    print(f"database {connection.vendor}; {len(documents)} documents ({args.pdfs} PDFs of {args.pages_per_pdf} pages, "
          f"{args.images} images), {pages_total} pages, {document_bytes / 1e6:.1f} MB; {args.pods} pods × "
          f"{args.lanes} lanes at zero latency; {args.clients} clients, {args.docs_per_job} documents a job")  # fmt: skip
    print(f"end to end: {done} pages done in {span:.2f} s = {result['pages_per_s']} pages/s "
          f"(goal >= {GOALS['pages_per_s']:g}); lost {result['lost']}, read twice {result['read_twice']}")  # fmt: skip
    print(f"control-plane CPU: {control_plane_s:.2f} s = {result['control_plane_cpu_ms_per_page']} ms/page "
          f"(goal <= {GOALS['control_plane_cpu_ms_per_page']:g}); by process: {result['cpu_s_by_process']}")  # fmt: skip
    print(f"bytes to pods: {result['bytes_to_pods_per_page']} per page against {result['document_bytes_per_page']} "
          f"document bytes per page: ratio {result['bytes_to_pods_ratio']} (goal <= {GOALS['bytes_to_pods_ratio']:g}); "
          f"{result['documents_put']} documents sent, {result['documents_put_again']} again, "
          f"{result['not_cached_answers']} 409s")  # fmt: skip
    if args.pdf:
        print(f"searchable PDFs: {result['pdfs_built']}/{len(documents)} built ({result['pdfs_failed']} failed), "
              f"the last {result['pdf_seconds_after_pages']} s after the last page; outputs workers' CPU "
              f"{outputs_s:.2f} s = {result['outputs_cpu_ms_per_page']} ms/page")  # fmt: skip
    print(f"uploads: {document_bytes / 1e6:.1f} MB accepted in {upload_s:.2f} s = {result['upload_mb_s']} MB/s "
          f"(goal >= {GOALS['upload_mb_s']:g})")  # fmt: skip
    print(json.dumps(result))


if __name__ == "__main__":
    main()
