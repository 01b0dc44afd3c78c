from __future__ import annotations

import os

import pytest
from django.contrib.auth import get_user_model

from accounts.models import ApiToken
from pods.models import Pool


@pytest.fixture(autouse=True)
def media_root(settings, tmp_path):
    settings.MEDIA_ROOT = tmp_path / "media"
    settings.MEDIA_ROOT.mkdir()
    return settings.MEDIA_ROOT


@pytest.fixture
def spool(tmp_path, settings):
    """Where uploads' temporary files go (FILE_UPLOAD_TEMP_DIR): empty once what a test took is closed."""
    spool = tmp_path / "spool"
    spool.mkdir()
    settings.FILE_UPLOAD_TEMP_DIR = str(spool)
    return spool


@pytest.fixture(autouse=True)
def plain_http(settings):
    # The test client speaks plain HTTP. With DATABASE_URL set (CI's PostgreSQL run) the settings
    # redirect it to HTTPS, as a deployment should; tests/fleetadmin/test_settings.py shows that. The
    # servers tests start are told the same by child_env (FLEETADMIN_HTTPS=false).
    settings.SECURE_SSL_REDIRECT = False


@pytest.fixture(autouse=True)
def forecasts_read_afresh(settings):
    # A forecast shows what the test just measured, not what a test a second ago did (a front
    # reuses a pool's measurements for a few seconds; tests/ocrjobs/test_forecast.py shows it).
    settings.FORECAST_BASIS_SECONDS = 0


@pytest.fixture(autouse=True)
def fast_boot_polls(settings):
    # Simulated pods come up in tenths of a second; a boot in a test asks as often as it used to.
    settings.POD_POLL_SECONDS = 0.2


@pytest.fixture(autouse=True)
def fresh_fleet_status():
    # The status snapshot lives as long as the process: no test sees the one before's fleet.
    from pods.selectors import fleet_status_snapshot

    fleet_status_snapshot.clear()
    yield
    fleet_status_snapshot.clear()


@pytest.fixture(autouse=True)
def pod_prefix_read_afresh():
    # The database's pod prefix is read once per process; a test's database may have another
    # (tests flush tables, and with them the row the migration wrote).
    from fleetadmin.deployment import forget

    forget()
    yield
    forget()


@pytest.fixture
def admin_user(db):
    return get_user_model().objects.create_user("alice", password="alice-pass-1", is_staff=True, is_superuser=True)


@pytest.fixture
def ordinary_user(db):
    return get_user_model().objects.create_user("bob", password="bob-pass-1")


@pytest.fixture
def outsider(db):
    return get_user_model().objects.create_user("mallory", password="mallory-pass-1")


def _token(user, scopes):
    return ApiToken.issue(user=user, name="test", scopes=scopes)[1]


@pytest.fixture
def admin_token(admin_user):
    return _token(admin_user, ["admin"])


@pytest.fixture
def submit_token(ordinary_user):
    return _token(ordinary_user, ["submit"])


@pytest.fixture
def read_token(ordinary_user):
    return _token(ordinary_user, ["read"])


@pytest.fixture
def local_pool(db):
    pool, _ = Pool.objects.get_or_create(
        key="local", defaults={"provider": "local", "min_pods": 0, "max_pods": 1, "lanes_per_pod": 2}
    )
    return pool


@pytest.fixture
def queued(db):
    """The django-q2 queues of every work class (ORM or Redis broker), emptied for this test.

    ``queued()`` lists the functions of the tasks enqueued since, in order, short tasks first
    (``queued("passes")``: one class's queue only); no cluster consumes them here.
    """
    from django_q.signing import SignedPackage

    from fleetadmin.clusters import CLASSES, brokers

    queues = brokers()
    for broker in queues.values():
        broker.purge_queue()
    Pool.objects.update(nudged_at=None)  # the nudged ticks just purged no longer hold nudges back

    def tasks(*work_classes: str) -> list[str]:
        found = []
        for work_class in work_classes or CLASSES:
            broker = queues[work_class]
            if hasattr(broker.connection, "lrange"):  # Redis
                raw = broker.connection.lrange(broker.list_key, 0, -1)
            else:
                raw = broker.connection.filter(key=broker.list_key).order_by("id").values_list("payload", flat=True)
            found += [SignedPackage.loads(item)["func"] for item in raw]
        return found

    return tasks


# CI runs the suite twice, side by side (.ci/run): on the embedded default, and with DATABASE_URL (PostgreSQL)
# and REDIS_URL. A slow test whose subject is not the database runs on one of them only: the
# browser, local pods and benchmarks at a small size on SQLite (once_sqlite), what only the
# scaled-out setup has on PostgreSQL (once_postgres). tests/test_ci_markers.py shows the hook.
ONCE_MARKERS = {
    "once_sqlite": (False, "runs once, on the SQLite run (once_sqlite)"),
    "once_postgres": (True, "runs once, on the PostgreSQL + Redis run (once_postgres)"),
}


def pytest_collection_modifyitems(config, items):
    postgres_run = bool(os.environ.get("DATABASE_URL"))
    for item in items:
        marked = [name for name in ONCE_MARKERS if item.get_closest_marker(name)]
        if len(marked) > 1:
            raise pytest.UsageError(f"{item.nodeid} is marked {' and '.join(marked)}: it would never run")
        for name in marked:
            runs_on_postgres, reason = ONCE_MARKERS[name]
            if runs_on_postgres != postgres_run:
                item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(scope="session")
def engines() -> dict[str, object]:
    """Tesseract through the C API (tesserocr, the default) and through the command, loaded once."""
    from podserver.engines import create

    through = {
        "api": create("tesseract", environ={}),
        "command": create("tesseract", environ={"TESSERACT_API": "false"}),
    }
    for engine in through.values():
        engine.load()
    return through
