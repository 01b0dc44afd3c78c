"""The dashboard's figures agree with the database and with each other on every push (issue 42,
item 2: "lanes busy" 16/8, a burn-rate card at $0/h beside its chart at $0.09/h, "spend today" $0
while a job had cost $0.0011, a job "2 running, ETA 54 s" in a pool with no pod). A fleet is
simulated step by step through the services a dispatcher, a drain and a release use: pages
claimed ahead of the lanes, sent to pods, read, pods draining and released; after each step the
push is rendered and its figures read back from the HTML it sends."""

from __future__ import annotations

import re
import uuid
from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from ocrjobs.models import Page
from ocrjobs.services.pages import page_complete, pages_assign_pods, pages_claim
from pods import dashboard, sections
from pods.models import Pod, Pool
from pods.selectors import fleet_status_snapshot
from pods.services.lifecycle import pod_release
from tests.ocrjobs.helpers import result_for
from tests.pods.dashboard_fixtures import make_job


def push() -> tuple[dict[str, str], dict]:
    """The staff payload of a push made now, and the status snapshot it was made from."""
    fleet_status_snapshot.clear()  # (the broadcaster's snapshot is at most a second old; steps here are quicker)
    sections.forget()
    payload = dashboard.render_payloads(staff=True, user_ids=[])[dashboard.STAFF]
    return payload, fleet_status_snapshot.get().data


def shown(payload: dict[str, str]) -> dict:
    pools = payload["pools"]

    def value(id_: str, attribute: str = "value") -> Decimal:
        return Decimal(re.search(rf'id="{id_}"[^>]*data-{attribute}="([^"]+)"', pools).group(1))

    rows = re.findall(r'<span class="small">(\d+) / (\d+)</span>', pools)
    jobs = re.findall(r'<tr id="job-(\d+)".*?</tr>', payload["jobs"], re.S)
    job_rows = dict(zip(jobs, re.findall(r'<tr id="job-\d+".*?</tr>', payload["jobs"], re.S), strict=True))
    return {
        "busy": int(value("stat-lanes", "used")),
        "lanes": int(value("stat-lanes", "total")),
        "pool_rows": [(int(a), int(b)) for a, b in rows],
        "burn": value("stat-burn"),
        "spend": value("stat-spend"),
        "chart_now": Decimal(re.search(r'chart-dollars" data-current="([^"]+)"', payload["charts"]).group(1)),
        "jobs": job_rows,
    }


def from_the_database(at) -> dict:
    """The same figures, counted from the rows at the push's moment."""
    serving = list(Pod.objects.filter(state__in=[Pod.State.READY, Pod.State.DRAINING]))
    at_pod = {
        pod.pk: min(
            pod.lanes, Page.objects.filter(pod=pod, status=Page.Status.RUNNING, claim_expires_at__gte=at).count()
        )
        for pod in serving
    }
    alive_billed = Pod.objects.alive().filter(billed_from__isnull=False)
    midnight = timezone.localtime(at).replace(hour=0, minute=0, second=0, microsecond=0)
    spend = Decimal(0)
    for pod in Pod.objects.filter(billed_from__isnull=False):
        start, end = max(pod.billed_from, midnight), min(pod.ended_at or at, at)
        if end > start:
            spend += pod.cost_per_hr * Decimal((end - start).total_seconds()) / 3600
    return {
        "busy": sum(at_pod.values()),
        # a draining pod's lanes still reading count, its free ones are no longer offered
        "lanes": sum(pod.lanes if pod.state == Pod.State.READY else at_pod[pod.pk] for pod in serving),
        "burn": sum((pod.cost_per_hr for pod in alive_billed), Decimal(0)),
        "spend": spend,
    }


def check(step: str, job) -> dict:
    payload, status = push()
    at = parse_datetime(status["at"])
    figures, truth = shown(payload), from_the_database(at)
    assert figures["busy"] <= figures["lanes"], step
    assert (figures["busy"], figures["lanes"]) == (truth["busy"], truth["lanes"]), step
    assert all(busy <= lanes for busy, lanes in figures["pool_rows"]), step
    assert tuple(map(sum, zip(*figures["pool_rows"], strict=True))) == (truth["busy"], truth["lanes"]), step
    assert figures["burn"] == figures["chart_now"] == round(truth["burn"], 2), step
    assert abs(figures["spend"] - truth["spend"]) <= Decimal("0.0002"), step
    row = figures["jobs"][str(job.pk)]
    running = re.search(r"· (\d+) running", row)
    cost = Decimal(re.search(r'data-label="cost">\$([\d.,]+)<', row).group(1)) if "$" in row else Decimal(0)
    assert cost <= figures["spend"] + Decimal("0.0001"), step  # a job's cost is part of what the pods billed
    figures["job_running"] = int(running.group(1)) if running else 0
    figures["job_eta"] = re.search(r'data-label="ETA">([^<]*)<', row).group(1)
    assert figures["job_running"] <= figures["busy"], step
    return figures


@pytest.mark.django_db
def test_every_push_agrees_with_the_database_as_the_fleet_works(ordinary_user):
    now = timezone.now()
    pool = Pool.objects.create(key="gpu", provider="runpod", max_pods=4, lanes_per_pod=4)
    pods = [
        Pod.objects.create(pool=pool, name=f"fa-gpu-{i}", state=Pod.State.READY, lanes=4, gpu_type="RTX A5000",
                           cost_per_hr=Decimal("0.44"), created_at=now - timedelta(minutes=30),
                           billed_from=now - timedelta(minutes=30), ready_at=now - timedelta(minutes=29))
        for i in range(2)
    ]  # fmt: skip
    job = make_job(ordinary_user, pool, pages=40)
    token = uuid.uuid4().hex

    # A dispatcher claims a page for every lane and one ahead for each: none is at a pod yet.
    claimed = pages_claim(pool_id=pool.pk, token=token, limit=16)
    figures = check("claimed ahead", job)
    assert (figures["busy"], figures["lanes"], figures["job_running"]) == (0, 8, 0)

    # Eight go out, four to each pod; eight wait in the dispatcher for a lane (this showed 16/8).
    out = claimed[:8]
    pages_assign_pods(token=token, assignments=[(p.id, p.attempts, pods[i % 2].pk) for i, p in enumerate(out)])
    figures = check("every lane busy, eight claimed ahead", job)
    assert (figures["busy"], figures["lanes"], figures["job_running"]) == (8, 8, 8)
    assert figures["burn"] == Decimal("0.88")

    # Four are read on the first pod.
    for page in out[0:8:2]:
        page_complete(page_id=page.id, token=token, pod_id=pods[0].pk, result={**result_for("read"), "seconds": 2.0})
    figures = check("four read", job)
    assert figures["busy"] == 4

    # The second pod drains: its free lanes are no longer offered; the four it is reading still are busy.
    Pod.objects.filter(pk=pods[1].pk).update(state=Pod.State.DRAINING)
    figures = check("one pod draining", job)
    assert (figures["busy"], figures["lanes"], figures["job_running"]) == (4, 8, 4)
    billed = figures["spend"]  # today's: since midnight, when the pods were billed from before it

    # Both released: no pod, no burn, no page running, no ETA; what they billed stays in today's spend.
    for pod in pods:
        pod_release(pod=Pod.objects.get(pk=pod.pk), reason="test")
    figures = check("every pod released", job)
    assert (figures["busy"], figures["lanes"], figures["burn"], figures["chart_now"]) == (0, 0, 0, 0)
    assert figures["job_running"] == 0 and figures["job_eta"] == "—"
    assert figures["spend"] >= billed  # what they billed stays, whatever the time of day

    # A new pod booting bills nothing yet.
    Pod.objects.create(pool=pool, name="fa-gpu-9", state=Pod.State.BOOTING, lanes=4, cost_per_hr=Decimal("0.44"))
    figures = check("a pod booting", job)
    assert (figures["busy"], figures["lanes"], figures["burn"]) == (0, 0, 0)
