"""The dashboard page, its fragments and the release button."""

from __future__ import annotations

import re
from contextlib import nullcontext
from datetime import timedelta
from decimal import ROUND_DOWN, Decimal
from unittest import mock

import pytest
from django.db import connection
from django.db.models import Sum
from django.test import Client
from django.test.signals import template_rendered
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from django_q.signing import SignedPackage

from fleetadmin.models import LoopHeartbeat
from ocrjobs import selectors
from ocrjobs.models import Job, Page
from ocrjobs.selectors.dashboard import _owners_jobs
from pods import charts, dashboard, sections
from pods.models import BootAttempt, Pod, SpendEntry, pod_name
from pods.providers.runpod import RunPodProvider
from pods.selectors import fleet_status_snapshot
from pods.services import lifecycle, passes
from tests.helpers import page_text
from tests.pods.dashboard_fixtures import make_job
from tests.pods.helpers import boot_until_settled

SECTION_IDS = ["dash-live", "dash-pools", "dash-charts", "dash-pods", "dash-jobs"]
STAFF_SECTION_IDS = ["dash-alerts", "dash-boots", "dash-loops"]


@pytest.fixture(autouse=True)
def empty_queue(db):
    """The passes' queue, where a release asks for a pass; every class's queue is emptied."""
    from fleetadmin.clusters import PASSES, brokers

    queues = brokers()
    for broker in queues.values():
        broker.purge_queue()
    yield queues[PASSES]
    for broker in queues.values():
        broker.purge_queue()


@pytest.fixture
def alice(admin_user):
    client = Client()
    client.force_login(admin_user)
    return client


@pytest.fixture
def bob(ordinary_user):
    client = Client()
    client.force_login(ordinary_user)
    return client


def words(fragment: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", fragment))


def release_url(pod: Pod) -> str:
    return f"/pods/{pod.pk}/release"


def queued_tasks(broker) -> list[dict]:
    tasks = []
    while True:
        batch = broker.dequeue()
        if not batch:
            return tasks
        for ack_id, payload in batch:
            tasks.append(SignedPackage.loads(payload))
            broker.acknowledge(ack_id)


# --- the page ------------------------------------------------------------------------------------


def test_an_anonymous_visitor_is_sent_to_log_in(client, db):
    response = client.get("/")

    assert response.status_code == 302
    assert response["Location"] == "/login/?next=/"


def test_staff_see_a_release_button_on_every_live_pod_and_no_other(alice, fleet):
    page = page_text(alice.get("/"))

    assert f'action="{release_url(fleet.ready)}"' in page
    assert f'action="{release_url(fleet.booting)}"' in page
    assert release_url(fleet.terminated) not in page
    assert release_url(fleet.failed) not in page
    assert 'hx-confirm="Release pod fa-gpu-ready1?' in page
    assert 'name="csrfmiddlewaretoken"' in page  # the button also works as a plain form


def test_a_non_staff_user_sees_the_pods_but_no_release_button(bob, fleet):
    page = page_text(bob.get("/"))

    assert f'id="pod-{fleet.ready.pk}"' in page
    assert "fa-gpu-ready1" in page
    assert "/release" not in page
    assert "Release" not in page


def test_the_page_shows_pods_jobs_alerts_verdicts_boots_and_loops(alice, fleet):
    page = page_text(alice.get("/"))

    for section in SECTION_IDS + STAFF_SECTION_IDS:
        assert f'id="{section}" hx-swap-oob="true"' in page
    assert 'hx-ext="ws" ws-connect="/ws/dashboard"' in page
    # pods: GPU, data centre, state, in flight / lanes, $/h; ended pods are not in the table
    pods = section_html(page, "dash-pod-list")
    assert "NVIDIA A40" in pods and "EU-RO-1" in pods and "US-KS-2" in pods
    assert "state-ready" in pods and "state-booting" in pods
    assert "0 / 4" in pods and "$0.4400" in pods
    assert "fa-gpu-gone4" not in pods and "fa-gpu-failed3" not in pods
    # pools: pods by state, backlog (mallory's 3 + bob's 2 waiting pages)
    pools = section_html(page, "dash-pools")
    assert "1 ready" in pools and "1 booting" in pools
    assert re.search(r'id="stat-backlog">5<', pools)
    # jobs of everybody, with owner and progress
    jobs = section_html(page, "dash-jobs")
    for job in (fleet.bobs_job, fleet.mallorys_job, fleet.admins_job):
        assert f'id="job-{job.pk}"' in jobs
    assert "mallory" in jobs and "2 / 4 pages" in words(jobs)
    # alerts: the open one, not the resolved one; the verdict with its TTL; the boot failure and failed pod
    alerts = section_html(page, "dash-alerts")
    assert "pages wait while lanes are free" in alerts
    assert "old budget alert" not in alerts
    assert "runpod|NVIDIA A100|SECURE|*" in alerts and "no capacity" in alerts
    assert re.search(r"1m 1[0-5]s", alerts), alerts  # ~75 s left
    assert "no_capacity" in alerts and "fa-gpu-failed3" in alerts and "model never loaded" in alerts
    boots = section_html(page, "dash-boots")
    assert "runpod|NVIDIA A40|SECURE|EU-RO-1" in boots and "created" in boots
    loops = section_html(page, "dash-loops")
    assert "web-1:4242" in loops and "4 ms" in loops and "310 ms" in loops


def test_a_loop_that_stopped_reporting_is_shown_as_such(alice, fleet):
    type(fleet.heartbeat).objects.filter(pk=fleet.heartbeat.pk).update(updated_at=timezone.now() - timedelta(minutes=2))

    loops = section_html(page_text(alice.get("/")), "dash-loops")

    assert "stopped reporting" in loops
    assert "2m 0" in loops


def test_a_non_staff_user_sees_only_their_own_jobs_and_no_staff_sections(bob, fleet):
    page = page_text(bob.get("/"))

    assert f'id="job-{fleet.bobs_job.pk}"' in page
    assert f'id="job-{fleet.mallorys_job.pk}"' not in page
    assert f'id="job-{fleet.admins_job.pk}"' not in page
    assert "mallory" not in page
    for section in STAFF_SECTION_IDS:
        assert f'id="{section}"' not in page
    assert "pages wait while lanes are free" not in page  # alert messages are for staff


def test_the_fallback_fragments_are_the_sections_for_that_user(alice, bob, fleet):
    staff = page_text(alice.get("/dashboard/sections"))
    other = page_text(bob.get("/dashboard/sections"))

    for section in SECTION_IDS + STAFF_SECTION_IDS:
        assert f'id="{section}" hx-swap-oob="true"' in staff
    for section in SECTION_IDS:
        assert f'id="{section}" hx-swap-oob="true"' in other
    for section in STAFF_SECTION_IDS:
        assert f'id="{section}"' not in other
    assert "Release" not in staff and "Release" not in other  # the pod list is fetched on its own
    assert f'id="job-{fleet.mallorys_job.pk}"' not in other


def test_the_pod_list_is_paged_and_only_staff_get_release_buttons(alice, bob, fleet, monkeypatch):
    monkeypatch.setattr(dashboard, "POD_PAGE_SIZE", 1)
    first, second = page_text(alice.get("/dashboard/pods?page=1")), page_text(alice.get("/dashboard/pods?page=2"))
    beyond = page_text(alice.get("/dashboard/pods?page=9"))

    assert first.startswith('<section id="dash-pod-list"') and "1–1 of 2" in first
    assert f'id="pod-{fleet.ready.pk}"' in first and f'id="pod-{fleet.booting.pk}"' not in first
    assert f'id="pod-{fleet.booting.pk}"' in second and "2–2 of 2" in second
    assert 'hx-get="/dashboard/pods?page=2"' in first and 'hx-get="/dashboard/pods?page=1"' in second
    assert "2–2 of 2" in beyond and f'id="pod-{fleet.booting.pk}"' in beyond  # past the end: the last
    assert f'action="{release_url(fleet.booting)}"' in second and 'name="csrfmiddlewaretoken"' in second
    others = page_text(bob.get("/dashboard/pods?page=2"))
    assert f'id="pod-{fleet.booting.pk}"' in others and "Release" not in others


def test_the_pushed_pod_section_is_a_summary_by_pool_state_and_gpu(alice, fleet):
    pods = section_html(page_text(alice.get("/dashboard/sections")), "dash-pods")

    assert "fa-gpu-ready1" not in pods and "Release" not in pods
    assert re.search(r"state-ready.*?NVIDIA A40.*?>1<", pods, re.S), pods


def test_the_page_reads_a_fixed_number_of_queries_whatever_the_fleet(alice, fleet, admin_user, ordinary_user):
    def queries() -> int:
        fleet_status_snapshot.clear()  # a full read each time, not the snapshot of the one before
        with CaptureQueriesContext(connection) as captured:
            assert alice.get("/").status_code == 200
        return len(captured)

    before = queries()
    for i in range(6):
        Pod.objects.create(pool=fleet.gpu, name=f"fa-gpu-more{i}", state=Pod.State.READY, lanes=4,
                           cost_per_hr=Decimal("0.30"), billed_from=timezone.now())  # fmt: skip
        make_job(ordinary_user if i % 2 else admin_user, fleet.gpu, pages=3, done=1, pod=fleet.ready)

    assert queries() == before


def test_a_staff_push_is_seven_statements(fleet, ordinary_user):
    # the pods' spend, the last minutes' pages, the boot attempts, the failed pods, the loops, the
    # jobs, their pages: the reads of one statement each (ocrjobs.selectors.IdsOf)
    dashboard.render_payloads(staff=True, user_ids=[])  # (the settled minutes kept)
    fleet_status_snapshot.get()
    with CaptureQueriesContext(connection) as captured:
        dashboard.render_payloads(staff=True, user_ids=[])

    assert len(captured) == 7, [query["sql"][:80] for query in captured]


def test_a_section_whose_data_did_not_change_is_not_rendered_again(fleet):
    def renders() -> list[str]:
        rendered: list[str] = []

        def record(sender, template, context, **kwargs):
            rendered.append(template.name)

        template_rendered.connect(record)
        try:
            payload = dashboard.render_payloads(staff=True, user_ids=[])[dashboard.STAFF]
        finally:
            template_rendered.disconnect(record)
        assert f'id="job-{fleet.mallorys_job.pk}"' in payload["jobs"]
        return rendered

    sections.forget()
    first = renders()
    again = renders()
    now = timezone.now()
    page = fleet.mallorys_job.pages.order_by("number").first()
    Page.objects.filter(pk=page.pk).update(status=Page.Status.DONE, pod=fleet.ready, seconds=5.0, finished_at=now)
    moved = renders()

    unchanged = {
        "partials/dash_job_row.html",
        "partials/dash_jobs.html",
        "partials/dash_pods.html",
        "partials/dash_boots.html",
    }
    assert first.count("partials/dash_job_row.html") == 3 and unchanged < set(first)
    # the same data: the pods, boots and jobs cost their reads, not a render
    assert not unchanged & set(again)
    # one job moved: its row alone is rendered again
    assert moved.count("partials/dash_job_row.html") == 1 and "partials/dash_pods.html" not in moved


def test_each_push_reads_what_changed_since_the_one_before_at_its_own_time(fleet, ordinary_user):
    """The push's reads run with each push's values: new rows show at once, and what the clock
    took out of a window goes."""

    def push(at=None) -> tuple[dict[str, str], dict[str, str]]:
        if at:  # a push's figures are of its status snapshot's moment: one read then
            fleet_status_snapshot.clear()
        with mock.patch("django.utils.timezone.now", return_value=at) if at else nullcontext():
            payloads = dashboard.render_payloads(staff=True, user_ids=[ordinary_user.pk])
        return payloads[dashboard.STAFF], payloads[f"user:{ordinary_user.pk}"]

    before, _ = push()
    job = make_job(ordinary_user, fleet.gpu, pages=2)
    BootAttempt.objects.create(pod=fleet.booting, candidate="runpod|NVIDIA L4|COMMUNITY|*", outcome="error",
                               error="image pull failed")  # fmt: skip
    LoopHeartbeat.objects.create(name="dispatcher-gpu", kind="dispatcher", host="worker-2", pid=77)
    SpendEntry.objects.create(pod=fleet.terminated, pool=fleet.gpu, job=fleet.bobs_job, dollars=Decimal(1), seconds=60)
    staff, bobs = push()
    later, _ = push(at=timezone.now() + timedelta(hours=2))

    assert f'id="job-{job.pk}"' not in before["jobs"]
    assert f'id="job-{job.pk}"' in staff["jobs"] and f'id="job-{job.pk}"' in bobs["jobs"]
    # two pages of 90 s on a 4-lane pod at $0.44/h, and the dollar of an ended pod's entry
    assert "$0.0055" in before["jobs"] and "$1.01" in staff["jobs"] and "$1.01" in bobs["jobs"]
    assert "image pull failed" in staff["boots"] and "image pull failed" in staff["alerts"]
    assert "dispatcher-gpu" in staff["loops"] and "dispatcher-gpu" not in before["loops"]
    # two hours on, the failures are out of the last hour and the loops stopped reporting
    assert "image pull failed" in later["boots"] and "image pull failed" not in later["alerts"]
    assert "model never loaded" in staff["alerts"] and "model never loaded" not in later["alerts"]
    assert "stopped reporting" not in staff["loops"] and later["loops"].count("stopped reporting") == 2


def test_the_kept_renderings_stay_within_their_bytes(db, monkeypatch):
    sections.forget()
    monkeypatch.setattr(sections, "KEPT_BYTES", 1000)
    for second in range(40):  # forty different stamps, ~100 bytes each
        sections._rendered("partials/dash_live.html", (second,), {"now": timezone.now(), "front": f"{second:012d}"})

    assert 0 < sum(len(html) for html in sections._kept.values()) <= 1000 and len(sections._kept) < 40
    sections.forget()


# --- numbers ------------------------------------------------------------------------------------


def test_a_jobs_cost_is_its_pages_time_on_pods_at_the_lane_price(fleet):
    (progress,) = dashboard.jobs_with_cost([fleet.bobs_job], now=timezone.now())

    # two pages of 90 s each on a 4-lane pod at $0.44/h
    assert progress.cost == Decimal("0.44") * 180 / 3600 / 4
    assert (progress.done, progress.expected, progress.percent) == (2, 4, 50)
    assert progress.pages_per_s == round(2 / 60, 2)
    assert progress.eta_s == pytest.approx(2 / round(2 / 60, 2))


def test_the_dashboard_the_job_api_and_the_spend_report_give_a_job_the_same_cost(
    alice, client, read_token, admin_token, admin_user, local_pool
):
    now = timezone.now()
    ended, live = (
        Pod.objects.create(pool=local_pool, name=name, state=Pod.State.READY, lanes=lanes, cost_per_hr=Decimal(price),
                           billed_from=now - timedelta(hours=1))
        for name, lanes, price in (("fa-local-ended", 2, "3.60"), ("fa-local-live", 4, "7.20"))
    )  # fmt: skip
    job = make_job(admin_user, local_pool, pages=3)
    for page, pod, seconds in zip(job.pages.order_by("number"), (ended, ended, live), (10.0, 20.0, 50.0), strict=True):
        Page.objects.filter(pk=page.pk).update(status=Page.Status.DONE, pod=pod, seconds=seconds, finished_at=now)
    lifecycle.pod_end(pod=ended, state=Pod.State.TERMINATED)  # its share of the job is now a spend entry

    (progress,) = [p for p in dashboard.page_context(admin_user)["jobs"] if p.job == job]
    report = client.get("/v1/runpod/spend", HTTP_AUTHORIZATION=f"Bearer {admin_token}").json()
    shown = client.get(f"/v1/jobs/{job.pk}", HTTP_AUTHORIZATION=f"Bearer {admin_token}").json()
    listed = client.get("/v1/jobs", HTTP_AUTHORIZATION=f"Bearer {admin_token}").json()["jobs"]

    # 30 s of a 2-lane pod at $3.60/h, ended; 50 s of a 4-lane pod at $7.20/h, live
    assert SpendEntry.objects.get(pod=ended, job=job).dollars == Decimal("0.015")
    assert progress.cost == Decimal("0.015") + Decimal("0.025")
    assert report["by_job"][str(job.pk)] == float(progress.cost)
    assert shown["dollars"] == float(progress.cost)
    assert [j["dollars"] for j in listed if j["id"] == job.pk] == [float(progress.cost)]
    assert "$0.0400" in words(section_html(page_text(alice.get("/")), "dash-jobs"))


def test_the_dashboard_lists_the_recent_active_jobs_and_the_last_finished_ones(local_pool, ordinary_user, outsider):
    for _ in range(selectors.DASHBOARD_ACTIVE_JOBS + 3):
        make_job(ordinary_user, local_pool, pages=1)
    for _ in range(selectors.DASHBOARD_FINISHED_JOBS + 2):
        make_job(ordinary_user, local_pool, pages=1, status=Job.Status.DONE)
    mallorys = make_job(outsider, local_pool, pages=1)

    everybody = selectors.jobs_for_dashboard()
    bobs = selectors.jobs_for_dashboard(owner_ids=[ordinary_user.pk])
    both = selectors.jobs_for_dashboard(owner_ids=[ordinary_user.pk, outsider.pk])

    assert sum(not j.is_finished for j in everybody) == selectors.DASHBOARD_ACTIVE_JOBS
    assert sum(j.is_finished for j in everybody) == selectors.DASHBOARD_FINISHED_JOBS
    assert everybody[0] == mallorys  # newest active first
    assert len(bobs) == selectors.DASHBOARD_ACTIVE_JOBS + selectors.DASHBOARD_FINISHED_JOBS
    assert {j.owner_id for j in bobs} == {ordinary_user.pk}
    assert mallorys in both and len(both) == len(bobs) + 1


def test_each_owners_newest_jobs_are_the_newest_of_each_status_in_turn(local_pool, ordinary_user, outsider):
    # more active jobs than shown, queued and running interleaved, and more finished ones, for two
    # owners: each owner's newest 20 active and newest 10 finished, whichever walk found them
    made = {}
    for i in range(2 * selectors.DASHBOARD_ACTIVE_JOBS + 4):
        status = (Job.Status.QUEUED, Job.Status.RUNNING, Job.Status.DONE, Job.Status.FAILED)[i % 4]
        for owner in (ordinary_user, outsider):
            job = make_job(owner, local_pool, pages=1, status=status)
            Job.objects.filter(pk=job.pk).update(created_at=timezone.now() - timedelta(minutes=i))  # newest first
            made.setdefault(owner.pk, []).append((job.pk, status in (Job.Status.QUEUED, Job.Status.RUNNING)))

    def expected(owner_id):  # newest first, as made
        return [pk for pk, active in made[owner_id] if active][: selectors.DASHBOARD_ACTIVE_JOBS] + [
            pk for pk, active in made[owner_id] if not active
        ][: selectors.DASHBOARD_FINISHED_JOBS]

    both = selectors.jobs_for_dashboard(owner_ids=[ordinary_user.pk, outsider.pk])
    everybody = selectors.jobs_for_dashboard()

    assert [job.pk for job in selectors.jobs_for_dashboard(owner_ids=[outsider.pk])] == expected(outsider.pk)
    assert [job.pk for job in both if job.owner_id == ordinary_user.pk] == expected(ordinary_user.pk)
    assert [job.pk for job in both if job.owner_id == outsider.pk] == expected(outsider.pk)
    assert len([job for job in everybody if not job.is_finished]) == selectors.DASHBOARD_ACTIVE_JOBS
    assert [job.created_at for job in everybody[: selectors.DASHBOARD_ACTIVE_JOBS]] == sorted(
        (job.created_at for job in Job.objects.exclude(status__in=Job.FINISHED)), reverse=True
    )[: selectors.DASHBOARD_ACTIVE_JOBS]


def test_the_dashboards_newest_jobs_are_one_statement_for_staff_and_for_any_number_of_owners(
    local_pool, ordinary_user, outsider
):
    make_job(ordinary_user, local_pool, pages=1)
    make_job(outsider, local_pool, pages=1, status=Job.Status.DONE)
    for owner_ids in (None, [ordinary_user.pk], [ordinary_user.pk, outsider.pk]):
        selectors.jobs_for_dashboard(owner_ids=owner_ids)
        with CaptureQueriesContext(connection) as captured:
            assert selectors.jobs_for_dashboard(owner_ids=owner_ids)
        assert len(captured) == 1, owner_ids
        assert "ROW_NUMBER" not in captured[0]["sql"].upper()  # (no ranking of whole histories)


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's statement (SQLite's: a walk each)")
def test_on_postgresql_the_owners_jobs_are_three_walks_whatever_the_number_of_owners(local_pool, ordinary_user):
    make_job(ordinary_user, local_pool, pages=1)
    for owners in (1, 20):
        owner_ids = [ordinary_user.pk] + list(range(10**6, 10**6 + owners - 1))
        with CaptureQueriesContext(connection) as captured:
            assert [job.owner_id for job in selectors.jobs_for_dashboard(owner_ids=owner_ids)] == [ordinary_user.pk]
        sql = captured[-1]["sql"]
        # (a UNION ALL of three walks an owner took PostgreSQL 33 ms to plan for 50 owners)
        assert sql.count("LIMIT") == 3 and sql.count("LATERAL") == 3, sql


@pytest.mark.skipif(connection.vendor != "sqlite", reason="SQLite's plan, which does not depend on the table's size")
def test_each_owners_jobs_are_read_by_short_walks_down_indexes_not_their_whole_history(db, ordinary_user, outsider):
    query = _owners_jobs(owner_ids=[ordinary_user.pk, outsider.pk]).query
    sql, params = query.get_compiler(connection=connection).as_sql()
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN QUERY PLAN " + sql, params)
        plan = [row[-1] for row in cursor.fetchall()]

    walks = [step for step in plan if "ocrjobs_job USING" in step and "PRIMARY KEY" not in step]
    assert len(walks) == 6, plan  # two owners, three walks each
    assert all(re.search(r"USING (COVERING )?INDEX job_owner_(status_)?created_idx \(owner_id=\?", w) for w in walks), (
        plan
    )
    assert sum("status=?" in w for w in walks) == 4, plan
    assert not [step for step in plan if re.match(r"SCAN ocrjobs_job\b", step)], plan


def test_the_recent_boots_and_the_last_hours_failures_are_one_statement_each_its_own_newest(fleet):
    now = timezone.now()
    for i in range(30):  # failures older than the newest boots, one of them out of the hour
        outcome = "created" if i < 18 else "error"
        BootAttempt.objects.create(pod=fleet.ready, candidate=f"c{i}", outcome=outcome, seconds=1.0,
                                   created_at=now - timedelta(minutes=2 * i))  # fmt: skip
    attempts = BootAttempt.objects.order_by("-created_at", "-id")
    expected_boots = list(attempts[: dashboard.RECENT_BOOTS])
    failing = attempts.exclude(outcome="created").filter(created_at__gte=now - dashboard.FAILURE_WINDOW)
    expected_failures = list(failing[: dashboard.RECENT_FAILURES])

    dashboard.boot_attempts(now=now)
    with CaptureQueriesContext(connection) as captured:
        boots, failures = dashboard.boot_attempts(now=now)

    assert len(captured) == 1
    assert boots == expected_boots and failures == expected_failures
    # most failures are older than the newest boots: the second walk's, not the first's
    assert len(failures) == dashboard.RECENT_FAILURES and len(set(failures) - set(boots)) >= 8
    with CaptureQueriesContext(connection) as captured:
        shown = [(b.pod.name, b.pod.pool.key) for b in boots + failures]
    assert len(captured) == 0 and shown == [(b.pod.name, b.pod.pool.key) for b in expected_boots + expected_failures]


def test_the_charts_count_pages_per_minute_and_dollars_per_hour(fleet):
    now = timezone.now()
    fleet_context, _ = dashboard.fleet_snapshot(now=now)
    charts = fleet_context["charts"]

    assert len(charts["pages"]["bars"]) == dashboard.CHART_MINUTES
    # the two pods billed now cost 0.44 + 0.24 $/h
    assert charts["dollars"]["current"] == pytest.approx(0.68, abs=0.01)
    # four pages finished ~10 s ago, in this minute or the one before
    per_minute = [bar["value"] for bar in charts["pages"]["bars"][-2:]]
    assert any(v > 0 for v in per_minute)
    # at least the ready pod's half hour at $0.44/h, or as much of it as today has had
    since_midnight = (now - timezone.localtime(now).replace(hour=0, minute=0, second=0, microsecond=0)).total_seconds()
    ready_today = Decimal("0.44") * Decimal(min(1800.0, since_midnight)) / 3600
    assert fleet_context["totals"]["spend_today"] >= ready_today.quantize(Decimal("0.01"), ROUND_DOWN)


def test_the_broadcaster_counts_a_settled_minute_once_and_the_last_minutes_every_time(fleet):
    def done_at(moment) -> None:
        page = fleet.mallorys_job.pages.filter(status=Page.Status.PENDING).first()
        Page.objects.filter(pk=page.pk).update(status=Page.Status.DONE, finished_at=moment, pod=fleet.ready)

    now = timezone.now()
    current = now.replace(second=0, microsecond=0)
    old = current - timedelta(minutes=10)
    done_at(old + timedelta(seconds=5))
    charts.forget_settled()

    first = charts.pages_by_minute(current - timedelta(minutes=59), now, keep=True)
    done_at(old + timedelta(seconds=6))  # (stored late: a settled minute is not counted again)
    done_at(now)
    kept = charts.pages_by_minute(current - timedelta(minutes=59), now, keep=True)
    counted = charts.pages_by_minute(current - timedelta(minutes=59), now, keep=False)

    assert first[old] == 1 and kept[old] == 1 and counted[old] == 2
    assert kept[current] == counted[current] == first.get(current, 0) + 1


def test_the_last_minutes_counted_one_by_one_are_counted_as_grouped_by_minute(fleet, ordinary_user):
    current = timezone.now().replace(second=0, microsecond=0)
    minutes = [current - timedelta(minutes=n) for n in (3, 2, 1, 0)]
    edges = [minutes[0], minutes[1] - timedelta(microseconds=1), minutes[1], minutes[2] + timedelta(seconds=30),
             minutes[3], minutes[3] + timedelta(microseconds=1)]  # fmt: skip
    job = make_job(ordinary_user, fleet.gpu, pages=len(edges))
    before = selectors.pages_done_in_minutes(minutes)  # (the fleet's pages done 10 s ago)
    for page, moment in zip(job.pages.order_by("number"), edges, strict=True):
        Page.objects.filter(pk=page.pk).update(status=Page.Status.DONE, finished_at=moment, pod=fleet.ready)

    grouped = selectors.pages_done_by_minute(since=minutes[0])
    one_by_one = selectors.pages_done_in_minutes(minutes)

    assert one_by_one == {minute: n for minute, n in grouped.items() if minute in minutes}
    assert [one_by_one.get(minute, 0) - before.get(minute, 0) for minute in minutes] == [2, 1, 1, 2]


@pytest.mark.parametrize("into_the_minute", [timedelta(0), timedelta(milliseconds=70), timedelta(seconds=30),
                                             timedelta(seconds=59, milliseconds=990)])  # fmt: skip
def test_the_dollars_per_hour_now_do_not_depend_on_how_far_into_the_minute_it_is(fleet, into_the_minute):
    # the pods were billed minutes before; CI once read $0.05/h at 70 ms past the minute
    now = timezone.now().replace(second=0, microsecond=0) + timedelta(minutes=1) + into_the_minute
    fleet_context, _ = dashboard.fleet_snapshot(now=now)

    assert fleet_context["charts"]["dollars"]["current"] == pytest.approx(0.68, abs=0.01)


# --- releasing a pod -----------------------------------------------------------------------------


def test_staff_release_ends_the_pod_now_and_leaves_the_provider_to_a_pass(
    alice, fleet, empty_queue, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        first = alice.post(release_url(fleet.ready))
        second = alice.post(release_url(fleet.ready))

    assert first.status_code == 302 and first["Location"] == "/"
    assert second.status_code == 302
    fleet.ready.refresh_from_db()
    assert fleet.ready.state == Pod.State.TERMINATED  # ended by the front, as the API's release does
    assert fleet.ready.error == "released: dashboard: alice"
    # its half hour at $0.44/h is attributed now, once
    spent = SpendEntry.objects.filter(pod=fleet.ready).aggregate(total=Sum("dollars"))["total"]
    assert spent == pytest.approx(Decimal("0.22"), abs=Decimal("0.001"))
    tasks = queued_tasks(empty_queue)
    assert [t["func"] for t in tasks] == ["pods.tasks.advance_pods"]  # one pass asked for, not one per release
    assert fleet.ready.terminate_pending
    page = page_text(alice.get("/"))
    assert "fa-gpu-ready1: release requested." in page and "fa-gpu-ready1 is already terminated." in page
    assert release_url(fleet.ready) not in section_html(page, "dash-pod-list")  # gone from the table at once


def test_the_release_button_has_a_pass_terminate_the_pod_at_the_provider(
    sim, pool, alice, empty_queue, transactional_db
):
    pod = boot_until_settled(Pod.objects.create(pool=pool, name=pod_name(pool, "dash"), lanes=pool.lanes_per_pod).pk)
    assert pod.state == Pod.State.READY, pod.error

    response = alice.post(release_url(pod), HTTP_HX_REQUEST="true")

    assert "release requested" in page_text(response)
    pod.refresh_from_db()
    assert pod.state == Pod.State.TERMINATED and SpendEntry.objects.filter(pod=pod).exists()
    assert sim.stats()["terminate_calls"] == 0  # the front never calls the provider
    assert [t["func"] for t in queued_tasks(empty_queue)] == ["pods.tasks.advance_pods"]
    passes.pass_run()  # what that task does
    assert sim.stats()["terminate_calls"] == 1 and RunPodProvider().get(pod.provider_id) is None


def test_an_htmx_release_answers_with_a_fragment(alice, fleet, empty_queue, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        response = alice.post(release_url(fleet.booting), HTTP_HX_REQUEST="true")

    assert response.status_code == 200
    assert "release requested" in page_text(response)
    assert len(queued_tasks(empty_queue)) == 1


def test_releasing_a_pod_that_already_ended_enqueues_nothing(
    alice, fleet, empty_queue, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        response = alice.post(release_url(fleet.terminated), HTTP_HX_REQUEST="true")

    assert response.status_code == 200
    assert "already terminated" in page_text(response)
    assert queued_tasks(empty_queue) == []


def test_release_of_an_unknown_pod_is_404(alice, fleet):
    assert alice.post("/pods/999999/release").status_code == 404


def test_a_non_staff_user_cannot_release_a_pod(bob, fleet, empty_queue, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        response = bob.post(release_url(fleet.ready))

    assert response.status_code == 403
    assert queued_tasks(empty_queue) == []


def test_an_anonymous_release_is_refused(client, fleet, empty_queue, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        assert client.post(release_url(fleet.ready)).status_code == 403
    assert queued_tasks(empty_queue) == []


def test_release_needs_the_csrf_token(admin_user, fleet, empty_queue, django_capture_on_commit_callbacks):
    client = Client(enforce_csrf_checks=True)
    client.force_login(admin_user)

    with django_capture_on_commit_callbacks(execute=True):
        assert client.post(release_url(fleet.ready)).status_code == 403
    assert queued_tasks(empty_queue) == []

    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', client.get("/").content.decode()).group(1)
    with django_capture_on_commit_callbacks(execute=True):
        assert client.post(release_url(fleet.ready), {"csrfmiddlewaretoken": token}).status_code == 302
    assert len(queued_tasks(empty_queue)) == 1


def test_release_answers_only_post(alice, fleet):
    assert alice.get(release_url(fleet.ready)).status_code == 405


def section_html(page: str, section_id: str) -> str:
    """The HTML of one section: from its opening tag to the next section's."""
    start = page.index(f'id="{section_id}"')
    others = SECTION_IDS + STAFF_SECTION_IDS + ["dash-pod-list", "dash-poll"]
    following = [page.find(f'id="{other}"', start + 1) for other in others]
    end = min((i for i in following if i > start), default=len(page))
    return page[start:end]
