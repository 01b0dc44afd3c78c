"""Webhooks: a job that ends posts a signed JSON event to its callback URL, through passes, with
back-off after a failure; deliveries and their attempts show in the API and on the job page."""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.utils import timezone

from ocrjobs.models import Job, WebhookDelivery, WebhookSecret
from ocrjobs.services import webhooks
from ocrjobs.services.jobs import job_cancel
from pods.services import passes
from tests import hostile
from tests.factories import image_bytes
from tests.ocrjobs.helpers import complete_all, split, submit
from tests.ocrjobs.test_submit_api import assert_refused

pytestmark = [pytest.mark.usefixtures("local_pool"), pytest.mark.django_db(transaction=True)]


class Receiver:
    """An HTTP server on loopback that answers each post with the next status of ``statuses``
    (the last one repeats) and keeps what it got."""

    def __init__(self, statuses: list[int]):
        self.statuses = list(statuses)
        self.received: list[tuple[dict, bytes]] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.received.append(({k.lower(): v for k, v in self.headers.items()}, body))
                status = receiver.statuses.pop(0) if len(receiver.statuses) > 1 else receiver.statuses[0]
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/hooks/ocr"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver(settings):
    settings.URL_FETCH_ALLOW_PRIVATE = True  # the test's receiver is on loopback
    made = []

    def make(*statuses: int) -> Receiver:
        made.append(Receiver(list(statuses) or [200]))
        return made[-1]

    yield make
    for server in made:
        server.close()


def finished_job(owner, url: str) -> Job:
    job = submit(owner, {"a.png": image_bytes(["a"])})
    Job.objects.filter(pk=job.pk).update(callback_url=url)
    split(job)
    complete_all(job)
    return Job.objects.get(pk=job.pk)


def run_queued_deliveries() -> int:
    """Run the delivery tasks waiting in the short-task queue, as a worker would; how many."""
    from django_q.signing import SignedPackage

    from fleetadmin.clusters import SHORT, brokers
    from ocrjobs import tasks

    broker = brokers()[SHORT]
    ran = 0
    while broker.queue_size():
        for ack_id, payload in broker.dequeue() or []:
            task = SignedPackage.loads(payload)
            broker.acknowledge(ack_id)
            if task["func"] == "ocrjobs.tasks.deliver_webhook":
                tasks.deliver_webhook(*task["args"])
                ran += 1
    return ran


def run_due_deliveries() -> None:
    """A pass (which only claims due deliveries and sends each to a task), then those tasks."""
    result = passes.pass_run()
    assert result is not None
    run_queued_deliveries()


def test_a_finished_job_posts_a_signed_event_through_a_pass(receiver, ordinary_user):
    hook = receiver(200)
    job = finished_job(ordinary_user, hook.url)
    assert job.status == Job.Status.DONE
    delivery = WebhookDelivery.objects.get(job=job)

    assert passes.rows_waiting(now=timezone.now())  # the supervisor's clock would ask for a pass
    run_due_deliveries()

    assert len(hook.received) == 1
    headers, body = hook.received[0]
    event = json.loads(body)
    assert event["event"] == "job.done" and event["job"]["id"] == job.pk and event["job"]["pages"]["done"] == 1
    secret = webhooks.webhook_secret_for(ordinary_user)
    expected = hmac.new(secret.encode(), f"{headers['x-fleetadmin-timestamp']}.".encode() + body, hashlib.sha256)
    assert headers["x-fleetadmin-signature"] == f"sha256={expected.hexdigest()}"
    assert abs(int(headers["x-fleetadmin-timestamp"]) - timezone.now().timestamp()) < 300
    delivery.refresh_from_db()
    assert delivery.state == WebhookDelivery.State.DELIVERED
    assert [attempt["status"] for attempt in delivery.attempts] == [200]


def test_a_500_is_retried_with_back_off_until_it_is_answered(receiver, ordinary_user):
    hook = receiver(500, 200)
    job = finished_job(ordinary_user, hook.url)
    delivery = WebhookDelivery.objects.get(job=job)

    run_due_deliveries()
    delivery.refresh_from_db()
    assert delivery.state == WebhookDelivery.State.PENDING
    assert [attempt["status"] for attempt in delivery.attempts] == [500]
    wait = (delivery.next_attempt_at - timezone.now()).total_seconds()
    assert 5 < wait <= webhooks.BACKOFF_SECONDS[0]
    assert webhooks.deliveries_due(now=timezone.now(), limit=10) == []  # not before its time

    WebhookDelivery.objects.filter(pk=delivery.pk).update(next_attempt_at=timezone.now())
    run_due_deliveries()

    delivery.refresh_from_db()
    assert delivery.state == WebhookDelivery.State.DELIVERED
    assert [attempt["status"] for attempt in delivery.attempts] == [500, 200]
    assert hook.received[0][1] == hook.received[1][1]  # the same event, signed afresh


def test_a_delivery_gives_up_after_a_day(receiver, ordinary_user):
    hook = receiver(503)
    job = finished_job(ordinary_user, hook.url)
    WebhookDelivery.objects.filter(job=job).update(
        created_at=timezone.now() - timezone.timedelta(hours=24) + timezone.timedelta(seconds=5)
    )

    run_due_deliveries()

    delivery = WebhookDelivery.objects.get(job=job)
    assert delivery.state == WebhookDelivery.State.FAILED and delivery.next_attempt_at is None
    assert not passes.rows_waiting(now=timezone.now() + timezone.timedelta(days=2))


def test_a_cancelled_job_posts_cancelled(receiver, ordinary_user):
    hook = receiver(200)
    job = submit(ordinary_user, {"a.png": image_bytes(["a"])})
    Job.objects.filter(pk=job.pk).update(callback_url=hook.url)

    job_cancel(job=Job.objects.get(pk=job.pk))
    run_due_deliveries()

    assert json.loads(hook.received[0][1])["event"] == "job.cancelled"


def test_a_callback_url_resolving_to_a_private_address_is_refused_at_delivery(settings, ordinary_user):
    settings.URL_FETCH_ALLOW_PRIVATE = False
    job = finished_job(ordinary_user, "http://localhost.example.test/hook")
    WebhookDelivery.objects.filter(job=job).update(url="http://localtest.me:9/hook")  # a public name for 127.0.0.1

    run_due_deliveries()

    attempt = WebhookDelivery.objects.get(job=job).attempts[0]
    assert "status" not in attempt
    assert "private or loopback" in attempt["error"] or "does not resolve" in attempt["error"]


def test_a_job_without_a_callback_url_queues_nothing(ordinary_user):
    finished_job(ordinary_user, "")

    assert WebhookDelivery.objects.count() == 0


@pytest.mark.parametrize(
    "url, words",
    [("ftp://example.org/hook", ["callback_url", "http"]), ("http://127.0.0.1/hook", ["callback_url", "private"]),
     ("http://10.1.2.3/hook", ["callback_url", "private"]), ("http://localhost/hook", ["callback_url", "private"])],
)  # fmt: skip
def test_a_bad_callback_url_is_refused_at_submission(client, submit_token, media_root, url, words):
    body = json.dumps({"urls": ["https://example.org/a.pdf"], "callback_url": url})

    response = client.post("/v1/jobs", body, content_type="application/json",
                           headers={"Authorization": f"Bearer {submit_token}"})  # fmt: skip

    assert_refused(response, 400, *words)
    assert Job.objects.count() == 0


def test_deliveries_and_their_attempts_show_in_the_api_and_on_the_job_page(
    receiver, client, submit_token, ordinary_user
):
    hook = receiver(500)
    job = finished_job(ordinary_user, hook.url)
    run_due_deliveries()

    body = client.get(f"/v1/jobs/{job.pk}", headers={"Authorization": f"Bearer {submit_token}"}).json()
    client.force_login(ordinary_user)
    page = client.get(f"/jobs/{job.pk}").content.decode()

    assert body["callback_url"] == hook.url
    [delivery] = body["webhook_deliveries"]
    assert delivery["state"] == "pending" and [a["status"] for a in delivery["attempts"]] == [500]
    assert "Webhook deliveries" in page and "HTTP 500" in page


@pytest.fixture
def webhooks_token(ordinary_user) -> str:
    from accounts.models import ApiToken

    return ApiToken.issue(user=ordinary_user, name="receiver setup", scopes=["webhooks"])[1]


def test_the_secret_is_the_callers_and_stays_the_same(client, webhooks_token, ordinary_user):
    headers = {"Authorization": f"Bearer {webhooks_token}"}
    first = client.get("/v1/webhooks/secret", headers=headers).json()
    again = client.get("/v1/webhooks/secret", headers=headers).json()

    assert first["secret"] == again["secret"] == webhooks.webhook_secret_for(ordinary_user)
    assert first["secret"].startswith("whsec_") and first["previous_signs_until"] is None


@pytest.mark.parametrize("scopes", [["read"], ["submit"]])
def test_the_secret_needs_its_own_scope(client, ordinary_user, scopes):
    # Review M3: a read token (a Prometheus scraper's) could learn it and forge signed events.
    from accounts.models import ApiToken

    token = ApiToken.issue(user=ordinary_user, name="t", scopes=scopes)[1]
    headers = {"Authorization": f"Bearer {token}"}

    assert client.get("/v1/webhooks/secret", headers=headers).status_code == 403
    assert client.post("/v1/webhooks/secret/rotate", headers=headers).status_code == 403


def _signatures(headers: dict) -> list[str]:
    return [part.strip() for part in headers["x-fleetadmin-signature"].split(",")]


def _signed(secret: str, headers: dict, body: bytes) -> str:
    digest = hmac.new(secret.encode(), f"{headers['x-fleetadmin-timestamp']}.".encode() + body, hashlib.sha256)
    return f"sha256={digest.hexdigest()}"


def test_a_rotated_secret_signs_beside_the_new_one_for_its_grace_then_alone(
    client, receiver, ordinary_user, webhooks_token, settings
):
    headers = {"Authorization": f"Bearer {webhooks_token}"}
    old = client.get("/v1/webhooks/secret", headers=headers).json()["secret"]
    rotated = client.post("/v1/webhooks/secret/rotate", headers=headers).json()
    assert rotated["secret"] != old and rotated["previous_signs_until"] is not None
    hook = receiver(200, 200)

    finished_job(ordinary_user, hook.url)
    run_due_deliveries()
    WebhookSecret.objects.filter(owner=ordinary_user).update(previous_until=timezone.now())  # the grace is over
    finished_job(ordinary_user, hook.url)
    run_due_deliveries()

    (during, during_body), (after, after_body) = hook.received
    assert _signatures(during) == [_signed(rotated["secret"], during, during_body), _signed(old, during, during_body)]
    assert _signatures(after) == [_signed(rotated["secret"], after, after_body)]


def test_the_delivery_id_is_inside_the_signed_body(receiver, ordinary_user):
    hook = receiver(500, 200)
    job = finished_job(ordinary_user, hook.url)
    delivery = WebhookDelivery.objects.get(job=job)

    run_due_deliveries()
    WebhookDelivery.objects.filter(pk=delivery.pk).update(next_attempt_at=timezone.now())
    run_due_deliveries()

    (first, first_body), (second, second_body) = hook.received
    assert json.loads(first_body)["delivery"] == json.loads(second_body)["delivery"] == str(delivery.pk)
    assert first["x-fleetadmin-delivery"] == str(delivery.pk)
    assert _signatures(second) == [_signed(webhooks.webhook_secret_for(ordinary_user), second, second_body)]


# The trust boundary (review H1): a receiver we do not control never holds a pass, nor a worker
# past the attempt's total deadline; an attempt counts from the moment it starts.


@pytest.mark.parametrize("behave", [hostile.trickled_headers, hostile.silent])
def test_a_receiver_that_trickles_or_stalls_is_cut_off_at_the_attempts_deadline(hostile_peer, ordinary_user,
                                                                                settings, behave):  # fmt: skip
    settings.WEBHOOK_TIMEOUT_SECONDS = 1.5
    server = hostile_peer(behave)
    job = finished_job(ordinary_user, server.url("/hook"))

    run_due_deliveries()  # would never return if only each read had a time limit

    delivery = WebhookDelivery.objects.get(job=job)
    [attempt] = delivery.attempts
    assert "within 1.5 s" in attempt["error"] and "status" not in attempt
    assert delivery.state == WebhookDelivery.State.PENDING and delivery.next_attempt_at > timezone.now()
    assert WebhookDelivery.objects.in_flight(now=timezone.now()).count() == 0  # its slot is free again


def test_a_compressed_answer_is_never_decoded(hostile_peer, ordinary_user):
    server = hostile_peer(hostile.bomb("br"))
    job = finished_job(ordinary_user, server.url("/hook"))

    run_due_deliveries()

    delivery = WebhookDelivery.objects.get(job=job)
    assert delivery.state == WebhookDelivery.State.DELIVERED  # the status is all a delivery reads
    assert server.header("Accept-Encoding") == "identity"


def test_an_attempt_is_recorded_when_it_starts_before_the_post_returns(hostile_peer, ordinary_user, settings,
                                                                       client):  # fmt: skip
    settings.WEBHOOK_TIMEOUT_SECONDS = 60
    server = hostile_peer(hostile.silent)
    job = finished_job(ordinary_user, server.url("/hook"))
    passes.pass_run()
    attempt = threading.Thread(target=run_queued_deliveries, daemon=True)
    attempt.start()
    try:
        assert server.connected.wait(30)
        delivery = WebhookDelivery.objects.get(job=job)
        # The POST has not returned (the receiver holds it): the attempt is counted already, and
        # its back-off is set, so a worker killed now still leaves it aging toward failed.
        assert attempt.is_alive()
        assert len(delivery.attempts) == 1 and "status" not in delivery.attempts[0]
        assert delivery.next_attempt_at > timezone.now()
        assert list(WebhookDelivery.objects.in_flight(now=timezone.now())) == [delivery]
        client.force_login(ordinary_user)
        assert "no answer yet" in client.get(f"/jobs/{job.pk}").content.decode()
    finally:
        server.close()
        attempt.join(60)
    assert not attempt.is_alive()


class _Killed(BaseException):
    """A worker stopped mid-attempt: nothing after the POST runs."""


def test_a_delivery_whose_attempts_are_all_killed_still_fails_after_a_day(hostile_peer, ordinary_user,
                                                                         monkeypatch):  # fmt: skip
    server = hostile_peer(hostile.silent)
    job = finished_job(ordinary_user, server.url("/hook"))

    def killed(delivery):
        raise _Killed

    monkeypatch.setattr(webhooks, "_post", killed)
    passes.pass_run()
    with pytest.raises(_Killed):
        run_queued_deliveries()
    monkeypatch.undo()
    # A day on, its lease long lapsed: the next pass does not post again, it gives up.
    a_day_ago = timezone.now() - timezone.timedelta(days=1, seconds=1)
    WebhookDelivery.objects.filter(job=job).update(created_at=a_day_ago, next_attempt_at=a_day_ago,
                                                   task_lease_until=a_day_ago)  # fmt: skip
    run_due_deliveries()

    delivery = WebhookDelivery.objects.get(job=job)
    assert delivery.state == WebhookDelivery.State.FAILED and len(delivery.attempts) == 1
    assert server.requests == []


def test_no_more_attempts_are_in_flight_than_the_cap(receiver, ordinary_user, settings):
    settings.WEBHOOK_MAX_IN_FLIGHT = 2
    settings.WEBHOOK_MAX_IN_FLIGHT_PER_OWNER = settings.WEBHOOK_MAX_IN_FLIGHT_PER_HOST = 2  # one owner, one host
    hook = receiver(200)
    jobs = [finished_job(ordinary_user, hook.url) for _ in range(3)]

    first = passes.pass_run()
    assert first.steps["webhook"] == 2
    assert passes.pass_run().steps["webhook"] == 0  # two in flight: the third waits
    assert run_queued_deliveries() == 2
    assert passes.pass_run().steps["webhook"] == 1
    assert run_queued_deliveries() == 1

    assert {d.state for d in WebhookDelivery.objects.filter(job__in=jobs)} == {WebhookDelivery.State.DELIVERED}
    assert len(hook.received) == 3


def test_deliveries_take_turns_by_owner_so_one_owners_backlog_leaves_another_a_slot(
    receiver, ordinary_user, outsider, settings
):
    """Review N6: one owner's deliveries, due first and many, never take every slot: another
    owner's, due later, goes in the same pass, and the owner's second waits for their first."""
    settings.WEBHOOK_MAX_IN_FLIGHT, settings.WEBHOOK_MAX_IN_FLIGHT_PER_OWNER = 2, 1
    settings.WEBHOOK_MAX_IN_FLIGHT_PER_HOST = 2
    hook = receiver(200)
    flood = [finished_job(ordinary_user, hook.url) for _ in range(3)]
    theirs = finished_job(outsider, hook.url.replace("127.0.0.1", "localhost"))

    first = webhooks.deliveries_due(now=timezone.now(), limit=10)
    owners = {WebhookDelivery.objects.get(pk=pk).job.owner_id for pk in first}
    assert owners == {ordinary_user.pk, outsider.pk}
    assert passes.pass_run().steps["webhook"] == 2
    assert run_queued_deliveries() == 2
    assert WebhookDelivery.objects.get(job=theirs).state == WebhookDelivery.State.DELIVERED
    assert WebhookDelivery.objects.filter(job__in=flood, state=WebhookDelivery.State.DELIVERED).count() == 1


def test_one_owner_holds_no_more_than_their_cap_and_one_host_no_more_than_its_own(
    receiver, ordinary_user, outsider, settings
):
    settings.WEBHOOK_MAX_IN_FLIGHT, settings.WEBHOOK_MAX_IN_FLIGHT_PER_OWNER = 4, 2
    settings.WEBHOOK_MAX_IN_FLIGHT_PER_HOST = 1
    hook = receiver(200)
    for _ in range(3):
        finished_job(ordinary_user, hook.url)
    finished_job(outsider, hook.url)  # the same host

    assert len(webhooks.deliveries_due(now=timezone.now(), limit=10)) == 1  # one host: one at a time
    settings.WEBHOOK_MAX_IN_FLIGHT_PER_HOST = 4
    chosen = webhooks.deliveries_due(now=timezone.now(), limit=10)
    owners = [WebhookDelivery.objects.get(pk=pk).job.owner_id for pk in chosen]
    assert sorted(owners) == sorted([ordinary_user.pk, ordinary_user.pk, outsider.pk])


def test_one_slot_goes_round_the_owners_in_turn(receiver, ordinary_user, outsider, settings):
    settings.WEBHOOK_MAX_IN_FLIGHT = settings.WEBHOOK_MAX_IN_FLIGHT_PER_OWNER = (
        settings.WEBHOOK_MAX_IN_FLIGHT_PER_HOST
    ) = 1
    hook = receiver(200)
    for _ in range(3):
        finished_job(ordinary_user, hook.url)
    for _ in range(2):
        finished_job(outsider, hook.url)

    order = []
    for _ in range(5):
        (sent,) = webhooks.deliveries_due(now=timezone.now(), limit=10)
        order.append(WebhookDelivery.objects.get(pk=sent).job.owner_id)
        assert passes.pass_run().steps["webhook"] == 1 and run_queued_deliveries() == 1

    bob, mallory = ordinary_user.pk, outsider.pk
    assert order == [bob, mallory, bob, mallory, bob]
