"""Slow unauthenticated bodies at the front: do a login and a one-page job keep their pace (issue 38, N1)?

    .venv/bin/python bench/slow_bodies.py [--database-url postgres://...] [--bodies 64,500] [--logins 5]
    .venv/bin/python bench/slow_bodies.py --small  # CI: 64 slow bodies

The review's attack (security-8630753.md, N1): connections that announce 2 GB bodies and trickle
~10 kB/s held every body slot of the front, and every login, form post and POST /v1/jobs got a
503. Here a real front (``python -m fleetadmin.front``) and the real workers (``manage.py
workers``) on a fresh database (SQLite unless ``--database-url``), the local pool's pod kept warm.

First, on the idle system: ``--logins`` real logins (the form's GET, then its POST with the CSRF
token: Django's 302), and a one-page job through the API (POST /v1/jobs, then until it is done).
Then, for each size in ``--bodies``, that many slow unauthenticated clients, each on a connection
of its own from an address of its own (127.1.0.0/16: any address of 127/8 is this machine's, so the
per-address cap does not stand in for the budgets), trickling 10 kB/s as the review's did; half of
them announce 2 GB (to /login/, /v1/jobs, /jobs/new, /healthz in turn: the review's attack), half
announce a body just under the small limit to /login/ (what the attack can still do: a small body
held for as long as the rate and the total time allow: silent for QUIET_SECONDS, then trickled); a client the front answers connects again
a second later. While they are held the same login and job are measured again, once.

Prints the figures and ends with one JSON line whose "goal" names each goal: the counted ones,
which CI (tests/bench/test_slow_bodies.py, ``--small``) asserts, per size
``login_answered_while_held_<n>`` (every login under the slow bodies answered 302, no 503),
``job_answered_while_held_<n>`` (the job's POST answered 201, no 503, and the job done with its
text), ``slow_bodies_held_<n>`` (at least 90% of the small slow bodies were being received when the
login and the job were measured: the attack was engaged) and ``large_refused_before_read_<n>``
(every 2 GB body refused, 401 or 413, none taken); and the timed ones, printed for a reader:
``login_within_2x_<n>`` and ``job_within_2x_<n>`` (the issue's goal: within 2 × the idle time;
the idle login is the median of ``--logins``). Also control_plane_cpu_within_ceiling, asserted by
CI too: the front's and the workers' CPU a second under the slow bodies (bench/_cpu.py) under
CPU_CEILING_MS_PER_SECOND. goal_met is all of them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench._cpu import CEILING_GOAL, control_plane_seconds, cpu_line, local_pod_roles, per_unit, within_ceiling
from bench._setup import bench_session, front_and_workers, parse_sized
from bench._swarm import ClientSwarm, status_of
from bench.control_plane import CpuMeter
from tools.processes import Children

PASSWORD = "a bench's long enough password"
WORDS = "A single page, read while slow bodies are held."
TRICKLE_BYTES = 1024  # every TRICKLE_SECONDS: 10 kB/s, the review's rate
TRICKLE_SECONDS = 0.1
LARGE_PATHS = ("/login/", "/v1/jobs", "/jobs/new", "/healthz")
SMALL_BODY_BYTES = 60_000  # under FRONT_SMALL_BODY_BYTES (64 KiB)
# A small body says nothing for this long first (within FRONT_BODY_GRACE_SECONDS, 10 s), then
# trickles: held ~14 s, about the longest the default rate and total time (20 s) allow.
QUIET_SECONDS = 8.0
HELD_SHARE = 0.9
RATIO_GOAL = 2.0
SMALL = {"bodies": "64", "logins": 3}
# The front's and the workers' CPU a second under the slow bodies (bench/_cpu.py), measured at
# --small: 138 ms on SQLite (bench/README.md). About three times that.
CPU_CEILING_MS_PER_SECOND = 450.0


class SlowBodies(ClientSwarm):
    """``count`` unauthenticated clients, each from an address of its own, trickling a body at
    10 kB/s on a connection of its own: even ones announce 2 GB, odd ones a small body to /login/;
    each connects again a second after the front answers it. On an event loop of its own thread;
    counts what the front answered each kind and how many small bodies are being sent now."""

    STAGGER_SECONDS = 0.005

    def __init__(self, host: str, port: int, count: int):
        super().__init__(host, port, count)
        self.answers: dict[str, dict[str, int]] = {"large": {}, "small": {}}
        self.sending = {"large": 0, "small": 0}

    @staticmethod
    def _kind(n: int) -> str:
        return "large" if n % 2 == 0 else "small"

    def _reset(self, n: int) -> None:
        self._count(self._kind(n), "reset")

    def _count(self, kind: str, status: str) -> None:
        self.answers[kind][status] = self.answers[kind].get(status, 0) + 1

    async def _one(self, n: int) -> None:
        kind, source = self._kind(n), f"127.1.{n // 250}.{n % 250 + 1}"
        reader, writer = await asyncio.open_connection(self.host, self.port, local_addr=(source, 0))
        self.sending[kind] += 1
        try:
            if kind == "large":
                path, length = LARGE_PATHS[(n // 2) % len(LARGE_PATHS)], 2_000_000_000
            else:
                path, length = "/login/", SMALL_BODY_BYTES
            writer.write(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/x-www-form-"
                         f"urlencoded\r\nContent-Length: {length}\r\n\r\n".encode())  # fmt: skip
            sent = 0
            quiet_until = time.monotonic() + (QUIET_SECONDS if kind == "small" else 0.0)
            while not self.stop.is_set() and sent < length:
                try:
                    answer = await asyncio.wait_for(reader.read(4096), TRICKLE_SECONDS)
                except TimeoutError:
                    if time.monotonic() < quiet_until:
                        continue
                    chunk = b"a" * min(TRICKLE_BYTES, length - sent)
                    writer.write(chunk)
                    sent += len(chunk)
                    await writer.drain()
                    continue
                self._count(kind, status_of(answer, "closed"))
                return
            if sent >= length:  # the whole small body sent: its answer (a 403: no CSRF token)
                answer = await asyncio.wait_for(reader.read(4096), 30)
                self._count(kind, status_of(answer, "closed"))
        finally:
            self.sending[kind] -= 1
            writer.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bodies", default="64,500", help="the numbers of slow clients, one phase each")
    parser.add_argument("--logins", type=int, default=5, help="idle logins measured (their median is the idle time)")
    args = parse_sized(parser, SMALL)
    with bench_session("slow-bodies", database_url=args.database_url, release_pods=True) as (children, _):
        run(args, children)


def run(args, children: Children) -> None:
    import httpx
    from django.contrib.auth import get_user_model
    from django.db import connection

    from accounts.models import ApiToken
    from ocrjobs.models import Job
    from pods.models import Pod, Pool
    from tests.factories import pdf_bytes

    local = Pool.objects.get(key="local")
    Pool.objects.filter(pk=local.pk).update(min_pods=1, max_pods=1, idle_seconds=3600)  # its pod kept warm
    user = get_user_model().objects.create_user("bench", password=PASSWORD)
    submit = {"Authorization": f"Bearer {ApiToken.issue(user=user, name='bench', scopes=['submit', 'read'])[1]}"}
    document = pdf_bytes([[WORDS]])
    front, workers, api = front_and_workers(children)
    front_url = str(api.base_url).rstrip("/")

    def until(predicate, seconds: float, what: str):
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            for child in (workers, front):
                if not child.alive():
                    raise SystemExit(f"{child.name} exited:\n{child.tail()}")
            if value := predicate():
                return value
            time.sleep(0.1)
        print(f"gave up waiting ({seconds:g} s): {what}", file=sys.stderr)
        return None

    def login() -> tuple[int, float]:
        """A real login, the form's GET and its POST: the POST's status and the seconds of both."""
        started = time.monotonic()
        with httpx.Client(base_url=front_url, timeout=60) as browser:
            csrf = browser.get("/login/").cookies["csrftoken"]
            answer = browser.post("/login/", data={"username": "bench", "password": PASSWORD,
                                                   "csrfmiddlewaretoken": csrf})  # fmt: skip
        return answer.status_code, time.monotonic() - started

    def one_page_job() -> tuple[int, float | None, bool]:
        """A one-page job through the API: the POST's status, the seconds to done (None: not
        done) and whether it is done with its text."""
        started = time.monotonic()
        answer = api.post("/v1/jobs", headers=submit, data={"pool": "local"},
                          files={"files": ("page.pdf", document, "application/pdf")})  # fmt: skip
        if answer.status_code != 201:
            return answer.status_code, None, False
        job_id = answer.json()["id"]
        done = until(lambda: Job.objects.filter(pk=job_id).exclude(finished_at=None).exists(), 180, f"job {job_id}")
        seconds = round(time.monotonic() - started, 3) if done else None
        text = api.get(f"/v1/jobs/{job_id}/result.txt", headers=submit)
        with_text = bool(done) and Job.objects.get(pk=job_id).status == Job.Status.DONE and "page" in text.text.lower()
        return 201, seconds, with_text

    # Warm-up: the local pod boots and joins; its first page and the first login are not measured.
    one_page_job()
    login()
    if not Pod.objects.filter(pool=local, state=Pod.State.READY).exists():
        raise SystemExit(f"the local pod never came up:\n{workers.tail()}")
    idle_logins = [login() for _ in range(args.logins)]
    idle_login = statistics.median(seconds for _, seconds in idle_logins)
    idle_job_status, idle_job, idle_text = one_page_job()
    if idle_job_status != 201 or idle_job is None:
        raise SystemExit(f"the idle job failed: {idle_job_status}:\n{workers.tail()}")

    host, port = front_url.removeprefix("http://").split(":")
    goal: dict[str, bool] = {}
    phases = []
    meter = CpuMeter(children)
    cpu_before, cpu_started = meter.read(local_pod_roles()), time.monotonic()
    for count in (int(n) for n in args.bodies.split(",")):
        slow = SlowBodies(host, int(port), count)
        slow.start()
        small_clients = count // 2
        until(lambda: slow.sending["small"] >= small_clients * HELD_SHARE, 60, "the small slow bodies")  # noqa: B023
        time.sleep(1.0)  # the large ones answered at least once, the small ones past their first kilobytes
        held_at_login = slow.sending["small"]
        login_status, login_s = login()
        held_at_job = slow.sending["small"]
        job_status, job_s, job_text = one_page_job()
        held_after = slow.sending["small"]
        slow.close()
        large_answers = slow.answers["large"]
        phase = {
            "slow_bodies": count,
            "login_status": login_status,
            "login_s": round(login_s, 3),
            "job_status": job_status,
            "job_s": job_s,
            "small_bodies_being_sent": {"at_login": held_at_login, "at_job": held_at_job, "after": held_after},
            "answers": slow.answers,
        }
        phases.append(phase)
        held = min(held_at_login, held_at_job) >= small_clients * HELD_SHARE
        goal |= {
            f"login_answered_while_held_{count}": login_status == 302,
            f"job_answered_while_held_{count}": job_status == 201 and job_text,
            f"slow_bodies_held_{count}": held,
            f"large_refused_before_read_{count}": bool(large_answers) and set(large_answers) <= {"401", "413"},
            f"login_within_2x_{count}": login_status == 302 and login_s <= RATIO_GOAL * idle_login,
            f"job_within_2x_{count}": job_s is not None and job_s <= RATIO_GOAL * idle_job,
        }
    # A second under the slow bodies is the unit of work: what serving (and refusing) them costs.
    cpu_s = control_plane_seconds(cpu_before[0], meter.read(local_pod_roles())[0])
    cpu = per_unit("second", cpu_s, time.monotonic() - cpu_started, CPU_CEILING_MS_PER_SECOND)
    goal["idle_job_done_with_text"] = idle_text
    goal[CEILING_GOAL] = within_ceiling(cpu)
    result = {
        "benchmark": "slow_bodies",
        "database": connection.vendor,
        "idle": {"login_s": round(idle_login, 3), "logins_s": [round(s, 3) for _, s in idle_logins], "job_s": idle_job},
        "phases": phases,
        **cpu,
        "goal": goal,
        "goal_met": all(goal.values()),
    }
    print(f"database {connection.vendor}; idle: a login {idle_login * 1000:.0f} ms (median of {args.logins}), "
          f"a one-page job {idle_job:.2f} s")  # fmt: skip
    for phase in phases:
        n = phase["slow_bodies"]
        print(f"{n} slow unauthenticated bodies ({n - n // 2} announcing 2 GB, {n // 2} small ones to /login/), "
              f"small ones being sent: {phase['small_bodies_being_sent']}")  # fmt: skip
        print(f"  login: {phase['login_status']} in {phase['login_s'] * 1000:.0f} ms (goal <= {RATIO_GOAL:g} × idle: "
              f"{'met' if goal[f'login_within_2x_{n}'] else 'NOT met'})")  # fmt: skip
        job = "not done" if phase["job_s"] is None else f"{phase['job_s']:.2f} s"
        print(f"  one-page job: {phase['job_status']}, {job} (goal <= {RATIO_GOAL:g} × idle: "
              f"{'met' if goal[f'job_within_2x_{n}'] else 'NOT met'})")  # fmt: skip
        print(f"  what the front answered the slow clients: {phase['answers']}")
    print(cpu_line(cpu) + " under the slow bodies")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
