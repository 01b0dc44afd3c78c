"""The work classes (fleetadmin/clusters.py): each its own django-q2 cluster and queue, sized from
configuration; each task sent to its class; the schedules pinned to short tasks; and the clock
that asks for passes (pods.services.passes.pass_tick, fleetadmin.clusters.PassClock).

tests/e2e/test_worker_supervisor.py runs the clusters for real."""

from __future__ import annotations

import importlib
import json
import logging
import re
import subprocess
import sys
from datetime import timedelta

import pytest
from django.db import OperationalError, connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from django_q.brokers import get_broker
from django_q.conf import Conf
from django_q.models import Schedule

from fleetadmin.clusters import (
    CLOCK_WORK,
    DISPATCH,
    PASSES,
    SHORT,
    PassClock,
    brokers,
    cluster_env,
    cluster_name,
    task_results_prune,
    work_classes,
)
from fleetadmin.schedules import setup_schedules
from ocrjobs.enqueue import enqueue_delivery, enqueue_dispatch, enqueue_fetch, enqueue_split, enqueue_splits
from pods import enqueue, tasks
from pods.models import PassLease, Pod, Pool, ScaleRequest
from pods.services import passes
from tools.processes import REPO, child_env

# --- the classes and their clusters ----------------------------------------------------------------

CONF_OF_A_CLUSTER = (
    "import json, os; os.environ['DJANGO_SETTINGS_MODULE'] = 'fleetadmin.settings'; import django; django.setup(); "
    "from django_q.conf import Conf; "
    "print(json.dumps({k: getattr(Conf, k) for k in ('PREFIX', 'CLUSTER_NAME', 'WORKERS', 'TIMEOUT', 'RETRY')}))"
)


def _conf_of_a_cluster(tmp_path, **env: str) -> dict:
    done = subprocess.run([sys.executable, "-c", CONF_OF_A_CLUSTER], cwd=REPO, env=child_env(tmp_path, **env),
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_each_class_cluster_gets_its_own_queue_size_and_time_limit_from_django_q2(tmp_path):
    sizes = {"Q_WORKERS": "3", "Q_PASS_WORKERS": "2", "Q_DISPATCH_WORKERS": "5", "Q_TIMEOUT": "600",
             "DISPATCH_MAX_SECONDS": "300", "PAGE_TIMEOUT_SECONDS": "100"}  # fmt: skip
    seen = {
        name: _conf_of_a_cluster(tmp_path, Q_CLUSTER_NAME=queue, **sizes)
        for name, queue in ((SHORT, "site"), (PASSES, "site:passes"), (DISPATCH, "site:dispatch"))
    }
    assert {name: (conf["CLUSTER_NAME"], conf["WORKERS"]) for name, conf in seen.items()} == {
        SHORT: ("site", 3),
        PASSES: ("site:passes", 2),
        DISPATCH: ("site:dispatch", 5),
    }
    assert {conf["PREFIX"] for conf in seen.values()} == {"site"}  # one deployment: tasks signed alike
    assert seen[SHORT]["TIMEOUT"] == 600
    assert seen[DISPATCH]["TIMEOUT"] > 300 + 100  # a loop at its time limit finishes its pages in flight
    for conf in seen.values():
        assert conf["RETRY"] >= 2 * conf["TIMEOUT"]  # a slow task is never handed to a second worker


def test_the_cluster_names_follow_the_deployments_queue_name(monkeypatch):
    monkeypatch.setattr(Conf, "PREFIX", "run-42")
    assert [cluster_name(c) for c in (SHORT, PASSES, DISPATCH)] == ["run-42", "run-42:passes", "run-42:dispatch"]
    with pytest.raises(ValueError):
        cluster_name("boots")


def test_the_dispatch_class_has_a_worker_per_loop_that_may_run(db, settings):
    settings.DISPATCHERS_PER_POOL = 2
    settings.Q_PASS_WORKERS = 1
    Pool.objects.all().delete()
    assert {c.name: c.workers for c in work_classes()}[DISPATCH] == 2  # at least a pool's worth
    for key in ("a", "b", "c"):
        Pool.objects.create(key=key)
    classes = {c.name: c for c in work_classes()}
    assert (classes[SHORT].workers, classes[PASSES].workers, classes[DISPATCH].workers) == (
        settings.Q_CLUSTER["workers"],
        1,
        6,
    )
    assert "DISPATCHERS_PER_POOL 2 × 3 pools" in classes[DISPATCH].describe()
    env = cluster_env(classes[DISPATCH], list(classes.values()))
    assert (env["Q_CLUSTER_NAME"], env["Q_DISPATCH_WORKERS"]) == (cluster_name(DISPATCH), "6")


def test_each_task_goes_to_its_class_queue(queued, local_pool, django_capture_on_commit_callbacks):
    enqueue_dispatch(local_pool)
    enqueue.enqueue_pass()
    enqueue_split(1)
    enqueue.nudge_scaler(local_pool.pk)

    assert queued(DISPATCH) == ["ocrjobs.tasks.dispatch_pool"]
    assert queued(PASSES) == ["pods.tasks.advance_pods"]
    assert queued(SHORT) == ["ocrjobs.tasks.split_document", "pods.tasks.scaler_tick"]


@pytest.mark.parametrize("sender", [PASSES, DISPATCH])
def test_short_tasks_sent_from_another_class_go_to_the_short_queue(queued, monkeypatch, sender):
    # django-q2 queues a task without a cluster on the sending process's own: a webhook attempt
    # sent from a pass once held the passes' one worker for its whole deadline.
    monkeypatch.setattr(Conf, "CLUSTER_NAME", cluster_name(sender))
    enqueue_delivery(1, "lease")
    enqueue_fetch(2)
    enqueue_split(3)
    enqueue_splits([4])

    assert queued(PASSES, DISPATCH) == []
    assert queued(SHORT) == ["ocrjobs.tasks.deliver_webhook", "ocrjobs.tasks.fetch_document",
                             "ocrjobs.tasks.split_document", "ocrjobs.tasks.split_documents"]  # fmt: skip


def test_the_schedules_run_in_the_short_tasks_cluster_only(queued, monkeypatch):
    from django_q import scheduler as django_q_scheduler
    from django_q.scheduler import scheduler

    monkeypatch.setattr(django_q_scheduler, "close_old_django_connections", lambda: None)  # the test's transaction
    setup_schedules()
    assert set(Schedule.objects.values_list("cluster", flat=True)) == {cluster_name(SHORT)}
    Schedule.objects.update(next_run=timezone.now() - timedelta(seconds=1))

    for other in (PASSES, DISPATCH):
        monkeypatch.setattr(Conf, "CLUSTER_NAME", cluster_name(other))
        scheduler(broker=get_broker(cluster_name(other)))
    assert queued() == []
    monkeypatch.setattr(Conf, "CLUSTER_NAME", cluster_name(SHORT))
    scheduler(broker=get_broker(cluster_name(SHORT)))
    assert queued(SHORT) == ["pods.tasks.scaler_tick"]


# --- the clock -------------------------------------------------------------------------------------


@pytest.fixture
def due_pools(monkeypatch):
    """The kinds of work a pass runs, replaced by one: pools whose shed tick is due (the concern
    modules' own kinds are tested with them)."""
    ids: list[int] = []
    work = passes.Work("stand-in", lambda *, now, limit: ids[:limit], lambda pool_id: None,
                       waiting=lambda now: Pool.objects.filter(shed_tick_at__lte=now))  # fmt: skip
    monkeypatch.setattr(passes, "kinds_of_work", lambda: [work])
    return ids


def test_the_clock_costs_one_query_when_nothing_waits(queued, due_pools, monkeypatch):
    monkeypatch.setattr(passes, "pass_due", lambda **kwargs: pytest.fail("nothing waits: no kind is asked"))
    with CaptureQueriesContext(connection) as queries:
        assert passes.pass_tick() is False
    assert len(queries) == 1
    assert queued() == []


@pytest.mark.parametrize("waiting", ["pod step", "shed tick", "scale request"])
def test_a_row_whose_time_has_come_is_waiting(local_pool, waiting):
    past = timezone.now() - timedelta(seconds=1)
    assert not passes.rows_waiting(now=timezone.now())
    if waiting == "pod step":
        Pod.objects.create(pool=local_pool, name="p1", step_at=past)
    elif waiting == "shed tick":
        Pool.objects.filter(pk=local_pool.pk).update(shed_tick_at=past)
    else:
        ScaleRequest.objects.create(pool=local_pool, target=1)
    assert passes.rows_waiting(now=timezone.now())
    assert not passes.rows_waiting(now=past - timedelta(seconds=1)) or waiting == "scale request"


def test_the_clock_sends_one_pass_while_something_is_due(
    queued, local_pool, due_pools, django_capture_on_commit_callbacks
):
    Pool.objects.filter(pk=local_pool.pk).update(shed_tick_at=timezone.now() - timedelta(seconds=1))
    assert passes.pass_tick() is False  # waiting, but no kind says it is due (a step holds its lease)

    due_pools.append(local_pool.pk)
    with django_capture_on_commit_callbacks(execute=True):
        assert passes.pass_tick() is True
        assert passes.pass_tick() is False  # one is queued already
    assert queued() == ["pods.tasks.advance_pods"] == queued(PASSES)

    PassLease.objects.update(task_lease_until=timezone.now() - timedelta(seconds=1))  # it was lost
    with django_capture_on_commit_callbacks(execute=True):
        assert passes.pass_tick() is True


def test_the_scaler_tick_asks_for_a_pass_too(queued, local_pool, due_pools, django_capture_on_commit_callbacks):
    Pool.objects.filter(pk=local_pool.pk).update(shed_tick_at=timezone.now() - timedelta(seconds=1))
    due_pools.append(local_pool.pk)
    with django_capture_on_commit_callbacks(execute=True):
        tasks.scaler_tick(local_pool.pk)
    assert "pods.tasks.advance_pods" in queued(PASSES)


def test_nudges_coalesce_while_a_nudged_tick_waits_in_the_queue(queued, local_pool):
    other = Pool.objects.create(key="other", provider="local")
    enqueue.nudge_scaler(local_pool.pk)
    enqueue.nudge_scaler(local_pool.pk)  # the first one's tick has not started: it covers this one
    enqueue.nudge_scaler(other.pk)  # another pool's nudge is its own
    assert queued() == ["pods.tasks.scaler_tick"] * 2


def test_a_nudge_after_the_tick_started_queues_another(queued, local_pool, monkeypatch):
    enqueue.nudge_scaler(local_pool.pk)
    seen = []
    monkeypatch.setattr(tasks.scaler, "pool_tick", lambda *, pool: seen.append(queued()) or pool)
    monkeypatch.setattr(tasks.passes, "pass_tick", lambda: None)

    tasks.scaler_tick(local_pool.pk)
    assert seen == [["pods.tasks.scaler_tick"]]  # the nudged one, running now
    enqueue.nudge_scaler(local_pool.pk)  # may come after the tick read what it is about
    assert queued() == ["pods.tasks.scaler_tick"] * 2


def test_the_minutes_tick_lets_the_next_nudge_through_too(queued, local_pool, monkeypatch):
    monkeypatch.setattr(tasks.passes, "pass_tick", lambda: None)
    enqueue.nudge_scaler(local_pool.pk)
    tasks.scaler_tick()
    enqueue.nudge_scaler(local_pool.pk)
    assert queued() == ["pods.tasks.scaler_tick"] * 2


def test_a_nudged_tick_lost_in_the_queue_holds_back_no_nudge_after_a_few_seconds(queued, local_pool):
    enqueue.nudge_scaler(local_pool.pk)
    queued_at = timezone.now() - timedelta(seconds=enqueue.NUDGE_COALESCE_SECONDS + 1)
    Pool.objects.filter(pk=local_pool.pk).update(nudged_at=queued_at)  # its worker was killed with -9
    enqueue.nudge_scaler(local_pool.pk)
    assert queued() == ["pods.tasks.scaler_tick"] * 2


def test_the_clock_survives_errors_logs_them_once_a_minute_and_says_when_it_works_again(monkeypatch, caplog):
    outcomes = [OperationalError("database is locked"), RuntimeError("boom"), None]
    closed = []

    def pass_tick():
        outcome = outcomes.pop(0)
        if outcome is not None:
            raise outcome

    monkeypatch.setitem(CLOCK_WORK, "passes", pass_tick)  # as pods/registrations.py registers it
    monkeypatch.setattr("fleetadmin.hosts.host_report", lambda: None)  # no database here
    monkeypatch.setattr("django.db.connections.close_all", lambda: closed.append(1))
    clock = PassClock()
    with caplog.at_level(logging.INFO, logger="fleetadmin.clusters"):
        clock()
        clock()
        clock()
    messages = [record.getMessage() for record in caplog.records]
    assert len([m for m in messages if "pass clock failed" in m]) == 1  # the second error within the minute
    assert any("works again" in m for m in messages)
    assert len(closed) == 2 and clock.failing_since is None


def test_the_clock_with_no_work_registered_fails_instead_of_asking_for_nothing(monkeypatch):
    monkeypatch.setattr("fleetadmin.clusters.CLOCK_WORK", {})  # as if pods/registrations.py had not run
    with pytest.raises(RuntimeError, match="no app registered the clock's work"):
        PassClock()()
    assert passes.pass_tick in CLOCK_WORK.values()  # what pods registers, back


# --- task results kept ---------------------------------------------------------------------------


def _task_rows(success: bool, count: int, start: int = 0) -> list[str]:
    from django_q.models import Task

    now = timezone.now()
    ids = [f"{'ok' if success else 'failed'}-{start + n}" for n in range(count)]
    for n, task_id in enumerate(ids):
        at = now + timedelta(seconds=start + n)
        Task.objects.create(id=task_id, name=task_id, func="pods.tasks.scaler_tick", started=at, stopped=at,
                            success=success, cluster=cluster_name(SHORT))  # fmt: skip
    return ids


def test_successful_tasks_beyond_those_kept_are_pruned_and_failures_stay(db):
    from django_q.models import Failure, Success

    successes, failures = _task_rows(True, 6), _task_rows(False, 3, start=100)

    assert task_results_prune(kept=4) == 2

    assert sorted(Success.objects.values_list("id", flat=True)) == sorted(successes[2:])  # the newest four
    assert sorted(Failure.objects.values_list("id", flat=True)) == sorted(failures)


def test_the_minutes_tick_prunes_task_results_not_django_q2s_monitor_on_every_task(db, local_pool, settings):
    from django_q.models import Success

    # The monitor's pruning loads every row kept before each task is saved: it is off.
    assert Conf.SAVE_LIMIT == 0
    settings.Q_SUCCESSES_KEPT = 2
    _task_rows(True, 5)

    tasks.scaler_tick(local_pool.pk)  # a nudge: no pruning
    assert Success.objects.count() == 5
    tasks.scaler_tick()  # the schedule's
    assert Success.objects.count() == 2


def _packages(work_class: str) -> list[dict]:
    """The tasks waiting in a class's queue (ORM or Redis broker), as django-q2's pusher reads them."""
    from django_q.signing import SignedPackage

    broker = get_broker(cluster_name(work_class))
    if hasattr(broker.connection, "lrange"):  # Redis
        raw = broker.connection.lrange(broker.list_key, 0, -1)
    else:
        raw = broker.connection.filter(key=broker.list_key).order_by("id").values_list("payload", flat=True)
    return [SignedPackage.loads(item) for item in raw]


def test_the_high_volume_tasks_keep_no_success_and_keep_their_failures(db, queued, local_pool):
    from django_q.models import Failure, Success, Task
    from django_q.monitor import save_task

    from ocrjobs.enqueue import enqueue_splits

    enqueue_splits([1, 2])  # one a submission
    enqueue.nudge_scaler(local_pool.pk)  # one with every burst of work
    enqueue.enqueue_pass()  # rare: kept
    packages = _packages(SHORT) + _packages(PASSES)
    assert [p["func"] for p in packages] == ["ocrjobs.tasks.split_documents", "pods.tasks.scaler_tick",
                                             "pods.tasks.advance_pods"]  # fmt: skip
    now = timezone.now()
    ended = {"started": now, "stopped": now, "sync": True}  # sync: the monitor keeps this test's connection
    broker = get_broker(cluster_name(SHORT))
    for package in packages:  # each ends as django-q2's worker hands it to the monitor
        save_task({**package, **ended, "success": True, "result": "ok"}, broker)

    assert list(Success.objects.values_list("func", flat=True)) == ["pods.tasks.advance_pods"]
    save_task({**packages[0], **ended, "id": "failed-split", "success": False, "result": "boom"}, broker)
    assert list(Failure.objects.values_list("func", flat=True)) == ["ocrjobs.tasks.split_documents"]
    assert Task.objects.count() == 2


# --- the ORM broker's poll ---------------------------------------------------------------------------


def test_the_orm_broker_polls_an_empty_queue_in_one_plain_statement_and_dequeues_as_django_q2_does(db):
    from django_q.brokers.orm import ORM
    from django_q.models import OrmQ

    from fleetadmin.brokers import OrmBroker

    broker, theirs = OrmBroker(list_key="poll-test"), ORM(list_key="poll-test")
    with CaptureQueriesContext(connection) as statements:
        assert broker.dequeue() is None
    assert len(statements) == 1 and statements[0]["sql"].startswith("SELECT 1 FROM")
    OrmQ.objects.create(key="poll-test", payload="claimed elsewhere", lock=timezone.now() + timedelta(minutes=5))
    assert broker.dequeue() is None and theirs.dequeue() is None
    OrmQ.objects.create(key="other-queue", payload="not ours", lock=timezone.now() - timedelta(seconds=1))
    assert broker.dequeue() is None
    ready = OrmQ.objects.create(key="poll-test", payload="ready", lock=timezone.now() - timedelta(seconds=1))
    assert broker.dequeue() == [(ready.pk, "ready")]
    assert broker.dequeue() is None  # claimed: locked until django-q2's retry


def test_the_embedded_default_queues_through_the_cheaper_orm_broker(db, settings):
    from fleetadmin.brokers import OrmBroker

    if settings.REDIS_URL:
        pytest.skip("Redis is the broker (REDIS_URL)")
    assert {type(broker) for broker in brokers().values()} == {OrmBroker}  # every class's queue


def test_every_task_an_enqueue_helper_names_is_a_function_of_its_tasks_module():
    for app in ("ocrjobs", "pods"):
        source = (REPO / app / "enqueue.py").read_text()
        names = set(re.findall(rf'"{app}\.tasks\.(\w+)"', source)) | set(re.findall(r'_send\(\s*"(\w+)"', source))
        assert names
        tasks_module = importlib.import_module(f"{app}.tasks")
        assert [name for name in sorted(names) if not callable(getattr(tasks_module, name, None))] == []


def test_each_app_registers_its_kinds_of_work_for_the_passes():
    assert [work.name for work in passes.kinds_of_work()] == [
        "boot",
        "terminate",
        "keepalive",
        "shed tick",
        "scale request",
        "webhook",
    ]
