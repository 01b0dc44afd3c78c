"""No one user takes every shared slot (issue 38, review N6 and N2, invariant 19).

    .venv/bin/python bench/fair.py [--database-url postgres://...] [--slow-urls 1000 --hostile-hooks 30]
        [--rebuilds 20 --frames 40 --frame-side 5000]
    .venv/bin/python bench/fair.py --small  # CI: 40 slow URLs, 6 tarpit hooks, 20 rebuilds of 12 frames

A real front (``python -m fleetadmin.front``) and the real workers (``manage.py workers``) on a
fresh database (SQLite unless ``--database-url``), the local pool's pod kept warm, the children
with URL_FETCH_ALLOW_PRIVATE=true (loopback servers stand in for hosts on the internet). Two
users: a victim, whose documents and receiver are on 127.0.0.2 and answer at once, and a flooder,
whose tarpits are on 127.0.0.1 and trickle until the deadline (tests/hostile.py).

The victim's three things, measured one after the other, idle and under each storm: a URL
document (submitted to done), a webhook (a one-page job with a callback, submitted to the POST
received) and a one-page job asking for its searchable PDF (submitted to done, and to the PDF built).

1. The flood (review N6): the flooder's job of ``--slow-urls`` URLs, each trickling its body for
   URL_FETCH_TIMEOUT_SECONDS, and ``--hostile-hooks`` jobs cancelled at once whose callback
   trickles its headers for WEBHOOK_TIMEOUT_SECONDS.
2. The rebuild storm (review N2): the flooder's TIFF of ``--frames`` blank frames of
   ``--frame-side`` pixels a side, cancelled once a page is read, then ``--rebuilds`` rebuilds of
   its searchable PDF, one every half-second while the victim's round runs
   (OUTPUT_REBUILDS_PER_HOUR raised for it).

Prints the figures and ends with one JSON line whose "goal" names each goal: the times, each
under a storm within 2× idle (url_document_within_2x, webhook_within_2x under the flood;
job_within_2x under the rebuild storm; printed, never asserted by CI), and the counted ones:
victim_url_not_behind_flood (the victim's URL document done, and no more of the flooder's
fetches started while it waited than URL_FETCH_MAX_IN_FLIGHT), victim_webhook_not_behind_flood
(the same for the flooder's attempts while the victim's event was due, WEBHOOK_MAX_IN_FLIGHT),
victim_pdf_not_behind_storm (the victim's PDF built, and at most two builds of the flooder's
started between it asked for and built), nothing_lost (every victim job done, its URL document
read, its PDF built), and the control plane's CPU a second under the flood (the tarpits served;
the storm's builds are CPU by design) under its ceiling; goal_met is all of them. CI
(tests/bench/test_fair.py) runs ``--small`` and asserts only the counted ones.
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench._cpu import CEILING_GOAL, control_plane_seconds, cpu_line, local_pod_roles, per_unit, within_ceiling
from bench._setup import bench_session, front_and_workers, parse_sized
from bench.control_plane import CpuMeter
from tools.processes import Children

RATIO_GOAL = 2.0
REBUILD_EVERY_SECONDS = 0.5
VICTIM_HOST = "127.0.0.2"  # the victim's servers: another host than the tarpits' (per-host caps)
WORDS = "A single page, read while another user floods."
SMALL = {"slow_urls": 40, "hostile_hooks": 6, "rebuilds": 20, "frames": 12, "frame_side": 2500}
# The front's and the workers' CPU a second under the flood at --small (its submissions and the
# tarpits served): 236 ms on SQLite; about three times that.
CPU_CEILING_MS_PER_SECOND = 750.0


class VictimServer:
    """The victim's host: GET answers the one-page PDF at once, POST (a webhook) is kept with its time."""

    def __init__(self, document: bytes):
        self.received: dict[str, float] = {}
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                self.send_response(200)
                self.send_header("Content-Type", "application/pdf")
                self.send_header("Content-Length", str(len(document)))
                self.end_headers()
                self.wfile.write(document)

            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                server.received.setdefault(self.path, time.monotonic())
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer((VICTIM_HOST, 0), Handler)
        self.base = f"http://{VICTIM_HOST}:{self.httpd.server_port}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def within(hostile: float | None, idle: float | None) -> bool:
    return hostile is not None and idle is not None and hostile <= RATIO_GOAL * idle


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slow-urls", type=int, default=1000, help="the flooder's URLs, each on a tarpit")
    parser.add_argument(
        "--hostile-hooks", type=int, default=30, help="the flooder's cancelled jobs with tarpit callbacks"
    )
    parser.add_argument("--rebuilds", type=int, default=20, help="rebuilds of the flooder's TIFF, all at once")
    parser.add_argument("--frames", type=int, default=40, help="blank frames of the flooder's TIFF")
    parser.add_argument("--frame-side", type=int, default=5000, help="pixels a side of each frame")
    parser.add_argument("--fetch-timeout", type=float, default=10.0, help="URL_FETCH_TIMEOUT_SECONDS of the children")
    parser.add_argument("--webhook-timeout", type=float, default=5.0, help="WEBHOOK_TIMEOUT_SECONDS of the children")
    args = parse_sized(parser, SMALL)
    env = {"URL_FETCH_ALLOW_PRIVATE": "true", "URL_FETCH_TIMEOUT_SECONDS": f"{args.fetch_timeout:g}",
           "WEBHOOK_TIMEOUT_SECONDS": f"{args.webhook_timeout:g}",
           "OUTPUT_REBUILDS_PER_HOUR": str(max(10, args.rebuilds * 2))}  # fmt: skip
    with bench_session("fair", database_url=args.database_url, env=env, release_pods=True) as (children, _):
        run(args, children)


def run(args, children: Children) -> None:
    import httpx
    from django.contrib.auth import get_user_model
    from django.db import connection

    from accounts.models import ApiToken
    from ocrjobs.models import Dispatcher, Document, Job, Page, SearchablePdf, WebhookDelivery
    from pods.models import Pod, Pool
    from tests import hostile
    from tests.factories import pdf_bytes
    from tests.ocrjobs.helpers import blank_tiff_frames

    local = Pool.objects.get(key="local")
    Pool.objects.filter(pk=local.pk).update(min_pods=1, max_pods=1, idle_seconds=3600)
    seen: dict[str, int] = {}
    users = get_user_model().objects
    victim = {"Authorization": "Bearer " + ApiToken.issue(user=users.create_user("victim"), name="bench",
                                                          scopes=["submit", "read"])[1]}  # fmt: skip
    flooder = {"Authorization": "Bearer " + ApiToken.issue(user=users.create_user("flooder"), name="bench",
                                                           scopes=["submit", "read"])[1]}  # fmt: skip
    document = pdf_bytes([[WORDS]])
    server = VictimServer(document)
    front, workers, api = front_and_workers(children)
    front_url = str(api.base_url).rstrip("/")

    def until(predicate, seconds: float, what: str, every: float = 0.1):
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            for child in (workers, front):
                if not child.alive():
                    raise SystemExit(f"{child.name} exited:\n{child.tail()}")
            if value := predicate():
                return value
            time.sleep(every)
        print(f"gave up waiting ({seconds:g} s): {what}", file=sys.stderr)
        return None

    def submit(headers, files=None, **fields) -> int:
        if files is None:
            response = api.post("/v1/jobs", headers=headers, json={"pool": "local", **fields})
        else:
            response = api.post("/v1/jobs", headers=headers, data={"pool": "local", **fields}, files=files)
        response.raise_for_status()
        return response.json()["id"]

    def finished(job_id: int) -> bool:
        return Job.objects.filter(pk=job_id).exclude(finished_at=None).exists()

    def victim_round(phase: str, counts: dict | None = None, on_job_done=None, on_pdf_done=None,
                     remote: bool = True) -> dict:  # fmt: skip
        """The victim's URL document and webhook (``remote``) and one-page job with its PDF: seconds
        each (None: not done). ``counts``: {"url" or "hook": a count of the flooder's}, kept in
        ``seen`` as it grew while the victim's URL waited for a fetch, its event for an attempt."""
        figures, ok = {}, []
        if remote:
            url_and_hook(phase, figures, ok, counts or {})
        started = time.monotonic()
        job_id = submit(victim, files={"files": ("page.pdf", document, "application/pdf")}, searchable_pdf="true")
        done = until(lambda: finished(job_id), 300, f"{phase}: the victim's one-page job")
        figures["job_s"] = round(time.monotonic() - started, 2) if done else None
        if on_job_done:
            on_job_done()
        built = until(lambda: SearchablePdf.objects.filter(document__job_id=job_id, status="built").exists(), 600,
                      f"{phase}: the victim's searchable PDF")  # fmt: skip
        figures["pdf_s"] = round(time.monotonic() - started, 2) if built else None
        if on_pdf_done:
            on_pdf_done()
        ok.append(bool(done and built) and Job.objects.get(pk=job_id).status == Job.Status.DONE)
        figures["all_done"] = all(ok)
        return figures

    def url_and_hook(phase: str, figures: dict, ok: list, counts: dict) -> None:
        count = counts.get("url", lambda: 0)
        started, before = time.monotonic(), count()
        url_job = submit(victim, urls=[f"{server.base}/{phase}.pdf"])
        done = until(lambda: finished(url_job), 300, f"{phase}: the victim's URL document")
        figures["url_document_s"] = round(time.monotonic() - started, 2) if done else None
        seen[f"{phase}_flooder_fetches_started_meanwhile"] = count() - before
        ok.append(done and Job.objects.get(pk=url_job).status == Job.Status.DONE)

        count = counts.get("hook", lambda: 0)
        started = time.monotonic()
        path = f"/hook/{phase}"
        hook_job = submit(victim, files={"files": ("page.pdf", document, "application/pdf")},
                          callback_url=server.base + path)  # fmt: skip
        until(lambda: finished(hook_job), 300, f"{phase}: the victim's job with a callback")
        before = count()  # its event is due from now
        got = until(lambda: path in server.received, 300, f"{phase}: the victim's webhook")
        figures["webhook_s"] = round(server.received[path] - started, 2) if got else None
        seen[f"{phase}_flooder_attempts_made_meanwhile"] = count() - before
        ok.append(bool(got))

    # Warm-up: the local pod boots and joins; its first page is not measured.
    warm = submit(victim, files={"files": ("page.pdf", document, "application/pdf")})
    until(lambda: finished(warm), 300, "the warm-up job")
    if not Pod.objects.filter(pool=local, state=Pod.State.READY).exists():
        raise SystemExit(f"the local pod never came up:\n{workers.tail()}")
    idle = victim_round("idle")

    # 1. The flood: slow URLs and tarpit callbacks, all the flooder's.
    meter = CpuMeter(children)
    cpu_before, cpu_started = meter.read(local_pod_roles()), time.monotonic()
    url_tarpit = hostile.HostilePeer(hostile.trickled_body)
    hook_tarpit = hostile.HostilePeer(hostile.trickled_headers)
    flood_job = submit(flooder, urls=[url_tarpit.url(f"/doc-{n}.pdf") for n in range(args.slow_urls)])
    hook_jobs = []
    for n in range(args.hostile_hooks):
        job_id = submit(flooder, files={"files": ("page.pdf", document, "application/pdf")},
                        callback_url=hook_tarpit.url(f"/hook-{n}"))  # fmt: skip
        api.post(f"/v1/jobs/{job_id}/cancel", headers=flooder).raise_for_status()
        hook_jobs.append(job_id)
    engaged = {"url_tarpit": bool(until(url_tarpit.connected.is_set, 60, "the URL tarpit's first connection")),
               "hook_tarpit": bool(until(hook_tarpit.connected.is_set, 60, "the hook tarpit's first connection"))}  # fmt: skip

    def flood_fetches() -> int:
        return sum(Document.objects.filter(job_id=flood_job).values_list("fetch_attempts", flat=True))

    def flood_attempts() -> int:
        return sum(
            len(a) for a in WebhookDelivery.objects.filter(job_id__in=hook_jobs).values_list("attempts", flat=True)
        )

    flood = victim_round("flood", counts={"url": flood_fetches, "hook": flood_attempts})
    # The control plane's CPU while it serves the tarpits (the builds of the storm are CPU by design).
    cpu_s = control_plane_seconds(cpu_before[0], meter.read(local_pod_roles())[0])
    cpu = per_unit("second", cpu_s, time.monotonic() - cpu_started, CPU_CEILING_MS_PER_SECOND)
    api.post(f"/v1/jobs/{flood_job}/cancel", headers=flooder).raise_for_status()
    url_tarpit.close()
    hook_tarpit.close()

    # 2. The rebuild storm: a TIFF of blank frames, cancelled once a page is read, rebuilt at once.
    tiff = blank_tiff_frames(args.frames, args.frame_side, args.frame_side)
    storm_job = submit(flooder, files={"files": ("blank.tif", tiff, "image/tiff")})
    until(lambda: Page.objects.filter(document__job_id=storm_job, status="done").exists(), 300, "a page of the TIFF")
    api.post(f"/v1/jobs/{storm_job}/cancel", headers=flooder).raise_for_status()
    until(lambda: finished(storm_job), 120, "the TIFF's job cancelled")
    # Its pages in flight on the pod finish first (a cancelled page's forward runs to its end, and
    # the dispatch loop ends after it): what is measured is the builds, not the pod's lanes.
    until(lambda: not Dispatcher.objects.live().filter(pool=local).exists(), 300, "the TIFF's pages in flight")
    answers: dict[int, int] = {}
    storm_pdf = SearchablePdf.objects.filter(document__job_id=storm_job)

    def rebuild_storm() -> None:
        """The rebuilds, one every REBUILD_EVERY_SECONDS (all at once would be one build: a rebuild
        asked while one is pending joins it), on a client of their own."""
        with httpx.Client(base_url=front_url, timeout=60) as client:
            for _ in range(args.rebuilds):
                status = client.post(f"/v1/jobs/{storm_job}/outputs/rebuild", headers=flooder).status_code
                answers[status] = answers.get(status, 0) + 1
                time.sleep(REBUILD_EVERY_SECONDS)

    storm_thread = threading.Thread(target=rebuild_storm, daemon=True)
    storm_thread.start()
    until(lambda: storm_pdf.filter(status="building").exists(), 120, "the first rebuild building")
    builds = {}

    def victim_pdf_asked() -> None:
        builds["before"] = sum(storm_pdf.values_list("builds", flat=True))

    def storm_builds() -> None:
        after = sum(storm_pdf.values_list("builds", flat=True))
        seen["storm_builds_before_victim_pdf"] = after - builds.get("before", after)

    storm = victim_round("storm", on_job_done=victim_pdf_asked, on_pdf_done=storm_builds, remote=False)
    storm_thread.join(REBUILD_EVERY_SECONDS * args.rebuilds + 60)
    server.close()

    from django.conf import settings

    goal = {
        "url_document_within_2x": within(flood["url_document_s"], idle["url_document_s"]),
        "webhook_within_2x": within(flood["webhook_s"], idle["webhook_s"]),
        "job_within_2x": within(storm["job_s"], idle["job_s"]),
        # A slot was the victim's at once: the flooder's own (one each, by their cap) went on meanwhile.
        "victim_url_not_behind_flood": flood["url_document_s"] is not None
        and seen.get("flood_flooder_fetches_started_meanwhile", args.slow_urls) <= settings.URL_FETCH_MAX_IN_FLIGHT,
        "victim_webhook_not_behind_flood": flood["webhook_s"] is not None
        and seen.get("flood_flooder_attempts_made_meanwhile", args.hostile_hooks) <= settings.WEBHOOK_MAX_IN_FLIGHT,
        "victim_pdf_not_behind_storm": storm["pdf_s"] is not None
        and seen.get("storm_builds_before_victim_pdf", args.rebuilds) <= 2,
        "nothing_lost": idle["all_done"] and flood["all_done"] and storm["all_done"],
        CEILING_GOAL: within_ceiling(cpu),
    }
    result = {
        "benchmark": "fair",
        "database": connection.vendor,
        "slow_urls": args.slow_urls,
        "hostile_hooks": args.hostile_hooks,
        "rebuilds": args.rebuilds,
        "tiff": {"frames": args.frames, "side": args.frame_side, "bytes": len(tiff)},
        "fetch_timeout_s": args.fetch_timeout,
        "webhook_timeout_s": args.webhook_timeout,
        "idle": idle,
        "flood": flood,
        "storm": storm,
        "engaged": engaged,
        "seen": seen,
        "rebuild_answers": answers,
        **cpu,
        "goal": goal,
        "goal_met": all(goal.values()),
    }
    print(f"database {connection.vendor}; the flooder: {args.slow_urls} slow URLs, {args.hostile_hooks} tarpit "
          f"callbacks, then {args.rebuilds} rebuilds of a TIFF of {args.frames} blank {args.frame_side}² frames")  # fmt: skip
    for name in ("url_document_s", "webhook_s", "job_s", "pdf_s"):
        print(
            f"victim's {name[:-2]}: idle {idle[name]} s, flood {flood[name]} s, rebuild storm {storm.get(name, '-')} s"
        )
    for name, met in goal.items():
        print(f"goal {name}: {'met' if met else 'NOT met'}")
    print(f"seen when the victim's things were done: {seen}; rebuild answers {answers}; engaged {engaged}")
    print(cpu_line(cpu) + " under the flood")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
