"""The autoscaler: demand from the database, stalls, sheds, budgets; and spend attribution."""

from __future__ import annotations

import threading
import uuid
from decimal import Decimal

import pytest
from django.utils import timezone

from ocrjobs.models import Document, Job, Page
from ocrjobs.services.jobs import job_cancel
from pods.models import Alert, Pod, Pool, SpendEntry, pod_name
from pods.services import lifecycle, passes, scaler
from pods.spend import jobs_spend, spend_report
from tests.pods.conftest import GOOD
from tests.pods.helpers import boot_until_settled, terminate_what_ended
from tests.pods.test_pod_services import _pages
from tests.runpod import use_simulator
from tools.processes import wait_for


def _pod(pool: Pool, **fields) -> Pod:
    fields.setdefault("lanes", pool.lanes_per_pod)
    return Pod.objects.create(pool=pool, name=pod_name(pool, uuid.uuid4().hex[:8]), **fields)


def test_demand_reads_the_pages_waiting_and_the_measured_page_time(pool, settings):
    # The arithmetic on these is the plan's, tested on plain values in tests/pods/test_planning.py.
    _pages(pool, 20)
    demand = scaler.pool_demand(pool)
    assert (demand.waiting, demand.seconds_per_page, demand.per_page_guessed) == (20, 2.0, True)
    done = Page.objects.filter(pool=pool)[:10]
    Page.objects.filter(pk__in=[p.pk for p in done]).update(status=Page.Status.DONE, seconds=4.0,
                                                            finished_at=timezone.now())  # fmt: skip
    demand = scaler.pool_demand(pool)
    assert (demand.waiting, demand.seconds_per_page, demand.per_page_guessed) == (10, 4.0, False)


def test_a_stalled_pool_rents_nothing_and_says_so_in_status(pool, settings, client, admin_token):
    settings.STALL_SECONDS = 30
    settings.SCALE_TARGET_SECONDS = 10
    long_ago = timezone.now() - timezone.timedelta(minutes=5)
    _pod(pool, state=Pod.State.READY, ready_at=long_ago, base_url="http://127.0.0.1:9/none")
    pages = _pages(pool, 51)[1:]  # plenty of demand for more pods
    # One page measured (growth waits for that), and the last start was minutes ago.
    Page.objects.filter(pk=pages[0].pk - 1).update(status=Page.Status.DONE, seconds=2.0, finished_at=long_ago)
    Page.objects.filter(pk=pages[0].pk).update(started_at=long_ago)

    result = scaler.pool_tick(pool=pool)

    assert result.booted == [] and result.blocked.startswith("dispatch stalled")
    assert Pod.objects.filter(pool=pool).count() == 1
    status = client.get("/v1/runpod/status", HTTP_AUTHORIZATION=f"Bearer {admin_token}").json()
    alerts = next(p for p in status["pools"] if p["key"] == pool.key)["alerts"]
    assert [a["kind"] for a in alerts] == ["stall"] and "50 pages waiting" in alerts[0]["message"]

    Page.objects.filter(pk=pages[1].pk).update(status=Page.Status.RUNNING, started_at=timezone.now(),
                                               claim_expires_at=timezone.now() + timezone.timedelta(minutes=1))  # fmt: skip
    scaler.pool_tick(pool=pool)  # pages start again: the alert is resolved
    assert not Alert.objects.filter(kind=Alert.Kind.STALL, resolved_at__isnull=True).exists()


@pytest.fixture
def slow_loading_sim(monkeypatch, settings):
    """Pods whose model takes seconds to load: a shed lands while boots are in model load."""
    from runpodsim import SimConfig, SimulatorThread
    from runpodsim.config import GpuTypeConfig

    config = SimConfig(api_key="sim-key", boot_delay_s=0.1, model_load_s=4.0,
                       gpu_types=[GpuTypeConfig(id=GOOD, display_name="good", secure_price=0.30,
                                                capacity={"SECURE": {"EU-RO-1": 3}})])  # fmt: skip
    with SimulatorThread(config) as simulator:
        use_simulator(simulator, monkeypatch, settings, api_key="sim-key")
        settings.DEPLOYMENT_PREFIX = f"t{uuid.uuid4().hex[:6]}"
        yield simulator


def test_a_shed_stops_an_anticipatory_boot_before_it_joins_but_not_one_pages_need(
    slow_loading_sim, transactional_db, settings
):
    settings.SCALE_TARGET_SECONDS = 1000
    pool = Pool.objects.create(key="gpu", provider="runpod", max_pods=4, lanes_per_pod=2, config={
        "image": "img:1", "candidates": [{"gpu_types": [GOOD], "data_centers": ["EU-RO-1"]}]})  # fmt: skip
    warm = _pod(pool, reason=Pod.Reason.WARM)
    needed = _pod(pool, reason=Pod.Reason.DEMAND)
    _pages(pool, 1)  # one page waits: one pod wanted, two booting
    threads = [threading.Thread(target=boot_until_settled, args=(pk,)) for pk in (warm.pk, needed.pk)]
    for thread in threads:
        thread.start()

    tick = scaler.pool_tick(pool=pool)  # the shed, while both boots are still loading
    for thread in threads:
        thread.join(timeout=60)

    assert tick.boots_cancelled == 1  # the shed says how many boots it stopped
    warm.refresh_from_db()
    needed.refresh_from_db()
    assert warm.state == Pod.State.TERMINATED and "cancelled by a shed" in warm.error
    assert needed.state == Pod.State.READY
    terminate_what_ended()  # what the next pass does
    assert slow_loading_sim.stats()["pods_running"] == 1


def test_a_shed_stops_boots_whose_pages_are_gone_newest_first_never_one_waiting_pages_need(pool, settings):
    settings.SCALE_TARGET_SECONDS = 1000  # one pod drains any backlog here
    older = _pod(pool, reason=Pod.Reason.DEMAND, created_at=timezone.now() - timezone.timedelta(minutes=1))
    newer = _pod(pool, reason=Pod.Reason.DEMAND)
    job = _pages(pool, 2)[0].job  # booted for more pages than wait now: one pod is wanted, two boot

    tick = scaler.pool_tick(pool=pool)

    assert tick.boots_cancelled == 1
    assert Pod.objects.get(pk=newer.pk).cancel_requested_at is not None
    assert Pod.objects.get(pk=older.pk).cancel_requested_at is None  # the waiting pages need it

    job_cancel(job=job)  # its pages gone, no page needs the other boot either
    assert scaler.pool_tick(pool=pool).boots_cancelled == 1
    assert Pod.objects.get(pk=older.pk).cancel_requested_at is not None


def test_a_pool_budget_cap_blocks_new_boots_with_an_alert(pool, settings):
    pool.max_dollars_per_hour = Decimal("0.20")
    pool.save()
    settings.SCALE_TARGET_SECONDS = 10
    settings.SCALE_MAX_OVERHEAD = 0.0  # the time target alone: 82 lane-s pay for no boot otherwise
    _pod(pool, state=Pod.State.READY, cost_per_hr=Decimal("0.30"), billed_from=timezone.now(),
         ready_at=timezone.now())  # fmt: skip
    measured = _pages(pool, 41)[0]  # one page measured: growth waits for that
    Page.objects.filter(pk=measured.pk).update(status=Page.Status.DONE, seconds=2.0, finished_at=timezone.now())
    result = scaler.pool_tick(pool=pool)
    assert result.booted == [] and result.blocked.startswith("budget cap")
    assert Alert.objects.filter(kind=Alert.Kind.BUDGET, pool=pool, resolved_at__isnull=True).exists()


def test_a_job_past_its_budget_wants_no_pod(pool):
    pages = _pages(pool, 4)
    job = pages[0].job
    billed_from = timezone.now() - timezone.timedelta(seconds=100)
    pod = _pod(pool, state=Pod.State.TERMINATED, cost_per_hr=Decimal("3.60"), billed_from=billed_from)
    Page.objects.filter(pk=pages[0].pk).update(
        status=Page.Status.DONE, pod=pod, seconds=20.0, finished_at=timezone.now()
    )
    pod.ended_at = timezone.now()
    pod.save()
    from pods.spend import spend_attribute

    spend_attribute(pod)
    Job.objects.filter(pk=job.pk).update(max_dollars=Decimal("0.01"))
    assert jobs_spend([job.pk])[job.pk] >= Decimal("0.01")
    assert scaler.pool_demand(pool).wanted == 0


def test_spend_is_attributed_to_jobs_by_busy_time_and_the_rest_to_the_pool(pool):
    start = timezone.now() - timezone.timedelta(seconds=100)
    pod = _pod(pool, state=Pod.State.READY, cost_per_hr=Decimal("3.60"), billed_from=start, lanes=2)
    a = _pages(pool, 2)
    b = _pages(pool, 1)
    for page in a + b:
        Page.objects.filter(pk=page.pk).update(
            status=Page.Status.DONE, pod=pod, seconds=10.0, finished_at=timezone.now()
        )
    Pod.objects.filter(pk=pod.pk).update(ended_at=start + timezone.timedelta(seconds=100))
    pod.refresh_from_db()
    lifecycle.pod_end(pod=pod, state=Pod.State.TERMINATED)

    entries = {e.job_id: e.dollars for e in SpendEntry.objects.filter(pod=pod)}
    # $3.60/h = $0.001/s for 100 s; a lane-second costs $0.0005.
    assert entries[a[0].job_id] == Decimal("0.010000")
    assert entries[b[0].job_id] == Decimal("0.005000")
    assert entries[None] == Decimal("0.085000")
    assert sum(entries.values()) == Decimal("0.100000")
    report = spend_report()
    assert report["by_pool"][pool.key] == pytest.approx(0.1)
    assert report["by_job"][str(a[0].job_id)] == pytest.approx(0.01)
    lifecycle.pod_end(pod=pod, state=Pod.State.TERMINATED)  # ending twice attributes once
    assert SpendEntry.objects.filter(pod=pod).count() == 3


def test_a_surplus_pod_not_idle_long_enough_gets_a_tick_the_moment_it_is(sim, pool, queued, transactional_db):
    pool.idle_seconds = 10
    pool.save()
    last_busy = timezone.now() - timezone.timedelta(seconds=4)
    pod = _pod(pool, state=Pod.State.READY, ready_at=last_busy, last_busy_at=last_busy, base_url="http://x")

    result = scaler.pool_tick(pool=pool)

    assert result.shed == []
    pool.refresh_from_db()
    assert pool.shed_tick_at == last_busy + timezone.timedelta(seconds=10.5)
    assert queued() == []  # a due time on the pool's row, not a task that sleeps in a worker
    scaler.pool_tick(pool=pool)
    pool.refresh_from_db()
    assert pool.shed_tick_at == last_busy + timezone.timedelta(seconds=10.5)  # one such tick per pool
    assert scaler.shed_ticks_due(now=timezone.now(), limit=10) == []
    passes.pass_run()  # a pass before then does not tick the pool
    pod.refresh_from_db()
    assert pod.state == Pod.State.READY

    # The tick's time comes (as if the clock had moved on): the next pass sheds the pod.
    Pod.objects.filter(pk=pod.pk).update(last_busy_at=last_busy - timezone.timedelta(seconds=10))
    Pool.objects.filter(pk=pool.pk).update(shed_tick_at=timezone.now())
    assert scaler.shed_ticks_due(now=timezone.now(), limit=10) == [pool.pk]
    result = passes.pass_run()

    assert result.steps["shed tick"] == 1
    pod.refresh_from_db()
    assert pod.state == Pod.State.TERMINATED and "idle" in pod.error
    pool.refresh_from_db()
    assert pool.shed_tick_at is None
    assert scaler.shed_tick_step(pool.pk) is False  # ticked once, by whichever pass came first


def test_passes_shed_an_idling_pod_the_moment_it_has_idled(sim, pool, transactional_db):
    """Driven by passes on the real clock, as the workers would ask for them: the pod is released
    once it has idled the pool's idle time, and not before."""
    pool.idle_seconds = 1
    pool.save()
    last_busy = timezone.now()
    pod = _pod(pool, state=Pod.State.READY, ready_at=last_busy, last_busy_at=last_busy, base_url="http://x")
    scaler.pool_tick(pool=pool)
    pool.refresh_from_db()
    due = pool.shed_tick_at
    assert due is not None

    def shed() -> bool:
        passes.pass_run()  # what the workers' clock asks for every PASS_INTERVAL_SECONDS
        pod.refresh_from_db()
        return pod.state == Pod.State.TERMINATED

    wait_for(shed, 30, "the idling pod was not shed", interval=0.1)
    assert pod.ended_at >= due > last_busy + timezone.timedelta(seconds=pool.idle_seconds)
    assert "idle" in pod.error


def test_a_surplus_pod_due_later_than_the_schedule_gets_no_tick_of_its_own(sim, pool, queued):
    pool.idle_seconds = 3600
    pool.save()
    _pod(pool, state=Pod.State.READY, last_busy_at=timezone.now(), base_url="http://x")

    scaler.pool_tick(pool=pool)

    pool.refresh_from_db()
    assert pool.shed_tick_at is None and queued() == []


def test_the_cost_cap_counts_the_boots_the_pool_measured(pool, settings):
    settings.SCALE_MAX_OVERHEAD = 0.1
    settings.SCALE_BOOT_SECONDS_GUESS = 600
    pool.idle_seconds, pool.max_pods = 0, 50
    pool.save()
    now = timezone.now()
    for took in (8, 12):  # measured: 10 s from create to ready
        _pod(pool, state=Pod.State.TERMINATED, created_at=now - timezone.timedelta(seconds=100),
             billed_from=now - timezone.timedelta(seconds=100), ready_at=now - timezone.timedelta(seconds=100 - took))  # fmt: skip
    _pages(pool, 1000)  # 1,000 pod-seconds

    assert scaler.boot_seconds(pool) == pytest.approx(10)
    assert scaler.pool_demand(pool).affordable == 10


def test_a_guessed_page_time_grows_no_fleet_whose_ready_pods_are_about_to_measure_it(pool, settings):
    settings.SCALE_MAX_OVERHEAD = 0.0
    settings.SCALE_TARGET_SECONDS = 10
    settings.SCALE_SECONDS_PER_PAGE_GUESS = 2.0  # no page measured yet
    pool.max_pods, pool.max_parallel_boots = 10, 10
    pool.save()
    pages = _pages(pool, 40)  # 40 × 2 s over 2 lanes in 10 s: the guess wants 4 pods

    assert len(scaler.pool_tick(pool=pool).booted) == 4  # no pod ready: it boots on the guess

    Pod.objects.filter(pool=pool).delete()
    _pod(pool, state=Pod.State.READY, ready_at=timezone.now())
    result = scaler.pool_tick(pool=pool)  # a ready pod will measure the page time in seconds: wait for it
    assert (result.wanted, result.serving, result.booted) == (4, 1, [])

    Page.objects.filter(pk=pages[0].pk).update(status=Page.Status.DONE, seconds=2.0, finished_at=timezone.now())
    assert len(scaler.pool_tick(pool=pool).booted) == 3  # measured: it grows again


def test_a_job_that_ends_ticks_its_pool_so_its_dry_pods_are_shed_once_idle(sim, pool, queued, transactional_db):
    from ocrjobs.services.jobs import jobs_refresh

    pool.idle_seconds = 10
    pool.save()
    last_busy = timezone.now() - timezone.timedelta(seconds=2)
    pod = _pod(pool, state=Pod.State.READY, ready_at=last_busy, last_busy_at=last_busy, base_url="http://x")
    pages = _pages(pool, 2)
    Page.objects.filter(pk__in=[p.pk for p in pages]).update(
        status=Page.Status.DONE, pod=pod, seconds=1.0, finished_at=last_busy
    )
    Document.objects.filter(job_id=pages[0].job_id).update(status=Document.Status.SPLIT)

    assert jobs_refresh(job_ids=[pages[0].job_id]) == [pages[0].job_id]

    assert Job.objects.get(pk=pages[0].job_id).status == Job.Status.DONE
    assert "pods.tasks.scaler_tick" in queued()
    scaler.pool_tick(pool=pool)  # the tick it asked for: the pod is due a shed tick when it has idled
    pool.refresh_from_db()
    assert pool.shed_tick_at == last_busy + timezone.timedelta(seconds=10.5)
