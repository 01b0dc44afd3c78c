"""Spend stays where it is allowed (issue 23 item 6): pools kept to staff or to groups, a user's
daily budget, and the $/h cap a new pool starts with."""

from __future__ import annotations

import json
from decimal import Decimal

import pytest
from django.contrib.auth.models import Group
from django.core.files.uploadedfile import SimpleUploadedFile
from django.utils import timezone

from accounts.models import ApiToken, Budget
from fleetadmin.env import EnvError, envdollars
from ocrjobs.models import Job
from pods.models import Pod, Pool, SpendEntry
from tests.factories import pdf_bytes
from tests.ocrjobs.helpers import assert_nothing_made

pytestmark = pytest.mark.usefixtures("local_pool")


def _submit(client, token: str, **fields):
    data = {"files": [SimpleUploadedFile("a.pdf", pdf_bytes())], **fields}
    return client.post("/v1/jobs", data, headers={"Authorization": f"Bearer {token}"})


def _token(user) -> str:
    return ApiToken.issue(user=user, name="test", scopes=["submit"])[1]


@pytest.fixture
def gpu_pool(db) -> Pool:
    return Pool.objects.create(key="gpu", provider="runpod", max_pods=8, staff_only=True)


def test_a_staff_only_pool_takes_jobs_from_staff_only(client, ordinary_user, admin_user, gpu_pool, media_root):
    refused = _submit(client, _token(ordinary_user), pool="gpu")

    assert refused.status_code == 403 and refused.json() == {"error": "pool 'gpu' is not open to you"}
    assert_nothing_made(media_root)
    assert _submit(client, _token(admin_user), pool="gpu").status_code == 201


def test_a_pool_kept_to_groups_takes_jobs_from_their_members(client, ordinary_user, outsider, local_pool):
    team = Group.objects.create(name="archive team")
    local_pool.groups.add(team)
    ordinary_user.groups.add(team)

    assert _submit(client, _token(ordinary_user), pool="local").status_code == 201
    assert _submit(client, _token(outsider), pool="local").status_code == 403


def test_without_a_pool_named_a_user_gets_the_first_pool_open_to_them(client, ordinary_user, local_pool):
    Pool.objects.filter(pk=local_pool.pk).update(staff_only=True)
    later = Pool.objects.create(key="open", provider="local")

    response = _submit(client, _token(ordinary_user))

    assert response.status_code == 201 and Job.objects.get().pool == later
    Pool.objects.filter(pk=later.pk).update(staff_only=True)
    assert _submit(client, _token(ordinary_user)).json() == {"error": "no pool is open to you: ask an administrator"}


def test_a_forecast_shows_only_the_pools_open_to_the_caller(client, ordinary_user, admin_user, gpu_pool):
    def pools(user) -> list[str]:
        body = _submit(client, _token(user), dry_run="true").json()
        return [pool["pool"] for pool in body["forecast"]["pools"]]

    assert pools(ordinary_user) == ["local"]
    assert pools(admin_user) == ["local", "gpu"]


def test_the_job_form_offers_only_open_pools_and_refuses_another(client, ordinary_user, gpu_pool):
    client.force_login(ordinary_user)

    page = client.get("/jobs/new").content.decode()
    response = client.post("/jobs/new", {"files": [SimpleUploadedFile("a.pdf", pdf_bytes())], "pool": "gpu"})

    assert 'value="local"' in page and 'value="gpu"' not in page
    assert response.status_code == 400 and "not one of the available choices" in response.content.decode()
    assert not Job.objects.exists()


# --- daily budgets ---------------------------------------------------------------------------


def _spent(job: Job, dollars: str) -> None:
    pod = Pod.objects.create(pool=job.pool, name=f"fa-spent-{job.pk}", state=Pod.State.TERMINATED)
    SpendEntry.objects.create(pod=pod, pool=job.pool, job=job, dollars=Decimal(dollars), seconds=60, at=timezone.now())


def test_a_job_gets_at_most_what_is_left_of_its_owners_day(client, ordinary_user, settings):
    settings.USER_DOLLARS_PER_DAY = Decimal("5")
    token = _token(ordinary_user)

    first = _submit(client, token, max_dollars="2")  # within what is left: its own budget stands
    second = _submit(client, token)  # no budget asked: what is left (nothing is spent yet)
    _spent(Job.objects.get(pk=first.json()["id"]), "2")
    third = _submit(client, token)  # 5 - the 2 the first has cost
    _spent(Job.objects.get(pk=third.json()["id"]), "3")
    fourth = _submit(client, token)

    assert (first.status_code, first.json()["max_dollars"]) == (201, 2.0)
    assert (second.status_code, second.json()["max_dollars"]) == (201, 5.0)
    assert (third.status_code, third.json()["max_dollars"]) == (201, 3.0)
    assert fourth.status_code == 429 and "daily budget of $5" in fourth.json()["error"]
    assert Job.objects.count() == 3


def test_jobs_running_at_once_share_the_day_rather_than_each_holding_it(client, ordinary_user, settings):
    # A job is not counted at its cap before it spends it: a second job of the day is taken while
    # the first runs (the scaler holds their sum to the day: tests/pods/test_scaler.py).
    settings.USER_DOLLARS_PER_DAY = Decimal("5")
    token = _token(ordinary_user)
    running = [Job.objects.get(pk=_submit(client, token).json()["id"]) for _ in range(3)]
    Job.objects.filter(pk__in=[job.pk for job in running]).update(status=Job.Status.RUNNING)

    assert [job.max_dollars for job in running] == [Decimal("5")] * 3
    assert _submit(client, token).status_code == 201


def test_users_who_are_not_staff_have_a_daily_budget_by_default():
    from django.conf import settings

    assert settings.USER_DOLLARS_PER_DAY == Decimal("50")


def test_a_finished_job_counts_what_it_cost_not_its_budget(client, ordinary_user, settings):
    settings.USER_DOLLARS_PER_DAY = Decimal("5")
    token = _token(ordinary_user)
    done = Job.objects.get(pk=_submit(client, token, max_dollars="4").json()["id"])
    Job.objects.filter(pk=done.pk).update(status=Job.Status.DONE)
    _spent(done, "1.25")

    assert _submit(client, token).json()["max_dollars"] == 3.75


def test_a_day_old_job_no_longer_counts(client, ordinary_user, settings):
    settings.USER_DOLLARS_PER_DAY = Decimal("5")
    token = _token(ordinary_user)
    old = Job.objects.get(pk=_submit(client, token).json()["id"])
    day_ago = timezone.now() - timezone.timedelta(hours=25)
    Job.objects.filter(pk=old.pk).update(created_at=day_ago, started_at=day_ago, status=Job.Status.DONE)

    assert _submit(client, token).json()["max_dollars"] == 5.0


def test_a_budget_row_overrides_the_default_for_staff_and_others(client, ordinary_user, admin_user, settings):
    settings.USER_DOLLARS_PER_DAY = Decimal("5")
    Budget.objects.create(user=ordinary_user, dollars_per_day=None)  # no limit for this user
    Budget.objects.create(user=admin_user, dollars_per_day=Decimal("1.50"))

    assert _submit(client, _token(ordinary_user)).json()["max_dollars"] is None
    assert _submit(client, _token(admin_user)).json()["max_dollars"] == 1.5


def test_staff_have_no_default_budget(client, admin_user, settings):
    settings.USER_DOLLARS_PER_DAY = Decimal("5")

    assert _submit(client, _token(admin_user)).json()["max_dollars"] is None


# --- a new pool's $/h cap, and the settings ----------------------------------------------------


def test_a_new_pool_in_the_admin_starts_with_the_default_dollars_per_hour(client, admin_user, settings):
    settings.POOL_DEFAULT_DOLLARS_PER_HOUR = Decimal("20")
    client.force_login(admin_user)

    page = client.get("/admin/pods/pool/add/").content.decode()

    assert 'name="max_dollars_per_hour" value="20"' in page


@pytest.mark.parametrize(("value", "dollars"), [("20", Decimal("20")), ("2.50", Decimal("2.50")), ("none", None)])
def test_dollar_settings_read_amounts_and_none(monkeypatch, value, dollars):
    monkeypatch.setenv("TEST_DOLLARS", value)

    assert envdollars("TEST_DOLLARS", "1") == dollars


@pytest.mark.parametrize("value", ["0", "-3", "2.555", "lots", "inf"])
def test_dollar_settings_refuse_what_is_not_an_amount(monkeypatch, value):
    monkeypatch.setenv("TEST_DOLLARS", value)

    with pytest.raises(EnvError, match="TEST_DOLLARS"):
        envdollars("TEST_DOLLARS", None)


def test_a_json_submission_is_refused_past_the_budget_too(client, ordinary_user, settings):
    settings.USER_DOLLARS_PER_DAY = Decimal("1")
    token = _token(ordinary_user)
    first = _submit(client, token)
    assert first.status_code == 201
    _spent(Job.objects.get(pk=first.json()["id"]), "1")

    response = client.post("/v1/jobs", json.dumps({"urls": ["https://example.org/a.pdf"]}),
                           content_type="application/json", headers={"Authorization": f"Bearer {token}"})  # fmt: skip

    assert response.status_code == 429


# --- retries spend as submissions do (issue 38, N4) ----------------------------------------------


def _partial(job: Job) -> None:
    """The job ended partial: its pages failed."""
    from tests.ocrjobs.helpers import split

    split(job)
    job.pages.update(status="failed", error="engine crashed")
    Job.objects.filter(pk=job.pk).update(status=Job.Status.PARTIAL, finished_at=timezone.now())


def test_a_retry_past_the_owners_daily_budget_is_refused(client, ordinary_user, settings):
    settings.USER_DOLLARS_PER_DAY = Decimal("10")
    token = _token(ordinary_user)
    job = Job.objects.get(pk=_submit(client, token, max_dollars="10").json()["id"])
    _partial(job)
    _spent(job, "10")  # what the owner's day allows, spent
    retried = client.post(f"/v1/jobs/{job.pk}/retry", headers={"Authorization": f"Bearer {token}"})

    assert retried.status_code == 429 and "daily budget of $10" in retried.json()["error"]
    job.refresh_from_db()
    assert job.status == Job.Status.PARTIAL and set(job.pages.values_list("status", flat=True)) == {"failed"}


def test_a_retried_jobs_budget_is_what_it_cost_and_what_is_left(client, ordinary_user, settings):
    settings.USER_DOLLARS_PER_DAY = Decimal("10")
    token = _token(ordinary_user)
    job = Job.objects.get(pk=_submit(client, token, max_dollars="8").json()["id"])
    _partial(job)
    _spent(job, "3")
    other = Job.objects.get(pk=_submit(client, token, max_dollars="6").json()["id"])
    _spent(other, "5")  # running, and has cost 5 so far

    retried = client.post(f"/v1/jobs/{job.pk}/retry", headers={"Authorization": f"Bearer {token}"})

    assert retried.status_code == 200 and retried.json()["max_dollars"] == 5.0  # 3 spent + (10 - 3 - 5) left
    assert other.pk != job.pk


def test_five_retries_cannot_each_spend_the_day(client, ordinary_user, settings):
    # The review's case: five jobs capped at the day's $10, each retried after spending it.
    settings.USER_DOLLARS_PER_DAY = Decimal("10")
    token = _token(ordinary_user)
    jobs = [Job.objects.get(pk=_submit(client, token, max_dollars="2").json()["id"]) for _ in range(5)]
    for job in jobs:
        _partial(job)
        _spent(job, "2")

    answers = [client.post(f"/v1/jobs/{job.pk}/retry", headers={"Authorization": f"Bearer {token}"}) for job in jobs]

    assert [answer.status_code for answer in answers] == [429] * 5


def test_a_job_retried_today_counts_in_todays_budget_however_old(client, ordinary_user, settings):
    settings.USER_DOLLARS_PER_DAY = Decimal("10")
    Budget.objects.create(user=ordinary_user, dollars_per_day=None)  # no limit while the old job runs
    token = _token(ordinary_user)
    old = Job.objects.get(pk=_submit(client, token, max_dollars="6").json()["id"])
    _partial(old)
    Job.objects.filter(pk=old.pk).update(created_at=timezone.now() - timezone.timedelta(days=3),
                                         started_at=timezone.now() - timezone.timedelta(days=3))  # fmt: skip
    Budget.objects.filter(user=ordinary_user).update(dollars_per_day=Decimal("10"))
    assert client.post(f"/v1/jobs/{old.pk}/retry", headers={"Authorization": f"Bearer {token}"}).status_code == 200
    _spent(old, "6")

    assert _submit(client, token).json()["max_dollars"] == 4.0  # the retried job has cost 6 of today's 10


def test_a_job_still_running_counts_however_long_ago_it_started(client, ordinary_user, settings):
    settings.USER_DOLLARS_PER_DAY = Decimal("5")
    token = _token(ordinary_user)
    running = Job.objects.get(pk=_submit(client, token, max_dollars="2").json()["id"])
    Job.objects.filter(pk=running.pk).update(status=Job.Status.RUNNING,
                                             started_at=timezone.now() - timezone.timedelta(hours=30))  # fmt: skip
    _spent(running, "2")

    assert _submit(client, token).json()["max_dollars"] == 3.0


def test_the_job_page_says_why_a_retry_was_refused(client, ordinary_user, settings):
    settings.USER_DOLLARS_PER_DAY = Decimal("1")
    job = Job.objects.get(pk=_submit(client, _token(ordinary_user), max_dollars="1").json()["id"])
    _partial(job)
    _spent(job, "1")
    client.force_login(ordinary_user)

    page = client.post(f"/jobs/{job.pk}/retry", follow=True).content.decode()

    assert "daily budget of $1" in page and Job.objects.get(pk=job.pk).status == Job.Status.PARTIAL


def test_the_form_shows_a_users_daily_budget_and_what_is_left(client, ordinary_user, admin_user, settings):
    settings.USER_DOLLARS_PER_DAY = Decimal("25")
    client.force_login(ordinary_user)
    assert "Your daily budget: $25.00; $25.00 left" in client.get("/jobs/new").content.decode()
    client.force_login(admin_user)
    assert "Your daily budget" not in client.get("/jobs/new").content.decode()


def test_a_users_day_counts_their_shares_of_live_pods_and_reads_no_job_list(ordinary_user, outsider, local_pool):
    # The day is what ended pods' entries charged the owner's jobs plus their shares of live pods,
    # summed without reading the owner's jobs into a list: a check costs the same on a user's
    # thousandth job of the day as on their first (an API user may send one document a job).
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from ocrjobs.models import Page
    from ocrjobs.selectors.budgets import days_spent
    from tests.factories import image_bytes
    from tests.ocrjobs.helpers import split, submit

    # $3.60 an hour on 2 lanes: $0.0005 a lane-second, $0.05 for a page's 100 s.
    live = Pod.objects.create(
        pool=local_pool, name="fa-live", state=Pod.State.READY, cost_per_hr=Decimal("3.60"), lanes=2
    )
    mine = [submit(ordinary_user, {f"{n}.png": image_bytes(["a line"])}) for n in range(6)]
    theirs = submit(outsider, {"x.png": image_bytes(["a line"])})
    for job in [*mine, theirs]:
        split(job)
        Page.objects.filter(job=job).update(
            status=Page.Status.DONE, pod=live, seconds=100.0, finished_at=timezone.now()
        )
    _spent(mine[0], "1.25")
    _spent(theirs, "7")

    with CaptureQueriesContext(connection) as queries:
        spent = days_spent([ordinary_user.pk])

    assert spent == {ordinary_user.pk: Decimal("1.25") + 6 * Decimal("0.05")}
    assert days_spent([outsider.pk]) == {outsider.pk: Decimal("7.05")}
    job_ids = {str(job.pk) for job in mine}
    listed = [q["sql"] for q in queries.captured_queries if "IN (" in q["sql"] and job_ids <= set(_numbers(q["sql"]))]
    assert not listed, f"the check read the owner's jobs into a list: {listed}"


def _numbers(sql: str) -> list[str]:
    import re

    return re.findall(r"\d+", sql)


def test_a_users_day_is_what_their_window_jobs_cost_as_each_jobs_spend_counts_it(ordinary_user, local_pool):
    # days_spent is one statement of our own SQL; each job's spend (pods.spend.jobs_spend) is read
    # through querysets. The day must be the sum of its jobs' spends to the micro-dollar: entries of
    # ended pods, shares of live ones, a first reading on a live pod of a page escalated since, and
    # neither a free pod, an ended pod's pages, nor a job that finished before the window.
    from datetime import timedelta

    from ocrjobs.models import Page
    from ocrjobs.selectors.budgets import days_spent
    from pods.spend import jobs_spend
    from tests.factories import image_bytes
    from tests.ocrjobs.helpers import split, submit

    priced = [Pod.objects.create(pool=local_pool, name=f"fa-p{n}", state=state, cost_per_hr=Decimal(price), lanes=lanes)
              for n, (state, price, lanes) in enumerate([(Pod.State.READY, "0.37", 3), (Pod.State.DRAINING, "1.1", 1),
                                                         (Pod.State.READY, "0", 2), (Pod.State.TERMINATED, "2", 1)])]  # fmt: skip
    jobs = [submit(ordinary_user, {f"{n}.png": image_bytes(["a line"]), f"{n}b.png": image_bytes(["b"])})
            for n in range(4)]  # fmt: skip
    for n, job in enumerate(jobs):
        split(job)
        first, second = Page.objects.filter(job=job).order_by("number")
        Page.objects.filter(pk=first.pk).update(status=Page.Status.DONE, pod=priced[n % 4], seconds=13.7 * (n + 1),
                                                finished_at=timezone.now())  # fmt: skip
        Page.objects.filter(pk=second.pk).update(first_pod=priced[(n + 1) % 4], first_seconds=4.1 * (n + 1))
        _spent(job, f"0.{n + 1}3")
    Job.objects.filter(pk=jobs[3].pk).update(status=Job.Status.DONE, started_at=timezone.now() - timedelta(days=2))

    window = jobs[:3]
    expected = sum(jobs_spend([job.pk for job in window]).values(), Decimal(0))

    assert days_spent([ordinary_user.pk]) == {ordinary_user.pk: expected}
    assert expected > Decimal("0.39")  # the three entries and some live shares
