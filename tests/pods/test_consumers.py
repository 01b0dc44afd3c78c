"""The dashboard's websocket: who may connect, what each kind of user receives, one broadcaster."""

from __future__ import annotations

import asyncio
import re
from datetime import timedelta

import aiohttp
import pytest
from asgiref.sync import async_to_sync
from channels import DEFAULT_CHANNEL_LAYER
from channels.db import database_sync_to_async
from channels.layers import channel_layers, get_channel_layer
from channels.testing import WebsocketCommunicator
from django.test import Client
from django.utils import timezone

from fleetadmin.asgi import application
from ocrjobs.models import Page
from pods import broadcast, dashboard
from pods.sections import RowsSection
from tests.pods.dashboard_fixtures import make_job
from tools.processes import child_env, start_front

# The websocket stack exactly as the front serves it (origin check, session auth, routing),
# without the loop watcher around it, which would write heartbeats from every test's loop.
WEBSOCKETS = application.app
ORIGIN = (b"origin", b"http://127.0.0.1")
GUARD = 10  # seconds, against hangs only

pytestmark = pytest.mark.usefixtures("transactional_db")


def session_cookie(user) -> tuple[bytes, bytes]:
    client = Client()
    client.force_login(user)
    return (b"cookie", f"sessionid={client.cookies['sessionid'].value}".encode())


def communicator(*headers: tuple[bytes, bytes]) -> WebsocketCommunicator:
    return WebsocketCommunicator(WEBSOCKETS, "/ws/dashboard", headers=[ORIGIN, *headers])


def run(scenario):
    """Each test runs its websocket scenario on a loop of its own, with an empty channel layer of
    its own. A layer outlives the loop it was used on (channels keeps one a process, as a front
    runs one loop): channels_redis leaves a lock bound to that loop when a receive waiting for it
    is cancelled (a client that left, a loaded machine), and the next loop that waited on it
    failed with 'bound to a different event loop' (tests/pods/test_consumers_loops.py)."""
    channel_layers.backends.pop(DEFAULT_CHANNEL_LAYER, None)

    async def wrapped():
        layer = get_channel_layer()
        await layer.flush()
        try:
            return await scenario()
        finally:
            task = broadcast.broadcaster().task
            if task is not None:
                await asyncio.wait_for(task, GUARD)  # it ends by itself once every client left
            if hasattr(layer, "close_pools"):  # Redis's: its connections end with the loop
                await asyncio.wait_for(layer.close_pools(), GUARD)

    return async_to_sync(wrapped)()


async def messages_for(comm: WebsocketCommunicator, seconds: float) -> list[str]:
    """Everything a client receives during a while (at least one message: the first full payload)."""
    received = [await comm.receive_from(timeout=GUARD)]
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while loop.time() < deadline:
        # receive_nothing() peeks; a receive_from() that times out would cancel the consumer
        if not await comm.receive_nothing(timeout=0.2, interval=0.02):
            received.append(await comm.receive_from(timeout=GUARD))
    return received


def ids_in(html: str) -> set[str]:
    return set(re.findall(r'<section id="([^"]+)" hx-swap-oob="true"', html)) | set(
        re.findall(r'<span id="([^"]+)" hx-swap-oob="true"', html)
    )


def test_an_anonymous_connection_is_closed_with_4401(fleet):
    async def scenario():
        comm = communicator()
        connected, _ = await comm.connect(timeout=GUARD)
        assert connected  # accepted only to say why it is closed: a bare refusal would be retried
        assert await comm.receive_output(timeout=GUARD) == {"type": "websocket.close", "code": 4401}
        assert await comm.receive_nothing(timeout=1.5)  # and nothing was sent before or after
        assert broadcast.broadcaster().task is None  # nobody to broadcast to: not even started

    run(scenario)


def test_a_connection_from_a_foreign_origin_is_refused(fleet, admin_user):
    cookie = session_cookie(admin_user)

    async def scenario():
        comm = WebsocketCommunicator(WEBSOCKETS, "/ws/dashboard", headers=[(b"origin", b"http://evil.example"), cookie])
        connected, _ = await comm.connect(timeout=GUARD)
        assert not connected

    run(scenario)


def test_staff_receive_every_section_with_the_pods_summarised_not_listed(fleet, admin_user):
    cookie = session_cookie(admin_user)

    async def scenario():
        comm = communicator(cookie)
        connected, _ = await comm.connect(timeout=GUARD)
        assert connected
        first = await comm.receive_from(timeout=GUARD)
        await comm.disconnect()
        return first

    first = run(scenario)

    assert ids_in(first) == {f"dash-{name}" for name in dashboard.sections_for(staff=True)}
    # the pods by pool, state and GPU; their rows and release buttons are paged on demand
    assert "NVIDIA A40" in first and "NVIDIA L4" in first
    assert f'id="pod-{fleet.ready.pk}"' not in first and "/release" not in first
    assert f'id="job-{fleet.mallorys_job.pk}"' in first
    assert "pages wait while lanes are free" in first


def test_a_non_staff_connection_never_receives_release_buttons_or_other_users_jobs(fleet, admin_user, ordinary_user):
    cookies = session_cookie(admin_user), session_cookie(ordinary_user)

    async def scenario():
        staff, other = (communicator(cookie) for cookie in cookies)
        assert (await staff.connect(timeout=GUARD))[0]
        assert (await other.connect(timeout=GUARD))[0]
        # the fleet changes while both watch: a new job for mallory, one for bob
        await asyncio.to_thread(make_job, fleet.mallorys_job.owner, fleet.gpu, pages=2)
        bobs_new = await asyncio.to_thread(make_job, ordinary_user, fleet.gpu, pages=5)
        staff_got, other_got = await asyncio.gather(messages_for(staff, 3.0), messages_for(other, 3.0))
        await staff.disconnect()
        await other.disconnect()
        return staff_got, other_got, bobs_new

    staff_got, other_got, bobs_new = run(scenario)

    assert ids_in(staff_got[0]) == {f"dash-{name}" for name in dashboard.sections_for(staff=True)}
    assert ids_in(other_got[0]) == {f"dash-{name}" for name in dashboard.sections_for(staff=False)}
    everything = "".join(other_got)
    assert "/release" not in everything and "Release" not in everything
    assert f'id="job-{fleet.bobs_job.pk}"' in everything
    assert f'id="job-{bobs_new.pk}"' in everything  # pushed live, without a reload
    assert f'id="job-{fleet.mallorys_job.pk}"' not in everything
    assert "mallory" not in everything
    assert not ids_in(everything) & {f"dash-{name}" for name in dashboard.STAFF_SECTIONS}


def sections_of(html: str) -> dict[str, str]:
    """{id: its HTML} of the out-of-band fragments in one message."""
    starts = [(m.start(), m.group(1)) for m in re.finditer(r'<(?:section|span) id="([^"]+)" hx-swap-oob="true"', html)]
    ends = [start for start, _ in starts[1:]] + [len(html)]
    return {name: html[start:end] for (start, name), end in zip(starts, ends, strict=True)}


def test_a_change_is_pushed_as_the_sections_that_changed(fleet, admin_user):
    cookie = session_cookie(admin_user)

    async def scenario():
        comm = communicator(cookie)
        assert (await comm.connect(timeout=GUARD))[0]
        messages = [await comm.receive_from(timeout=GUARD)]
        heartbeat = fleet.heartbeat
        heartbeat.lag_s = 2.5
        await asyncio.to_thread(heartbeat.save)
        while "2.50 s" not in messages[-1]:  # until the gauge shows the new lag
            messages.append(await comm.receive_from(timeout=GUARD))
        await comm.disconnect()
        return messages

    first, *updates = run(scenario)

    assert "dash-loops" in ids_in(first) and "dash-pods" in ids_in(first)
    assert "dash-loops" in ids_in(updates[-1]) and "level-bad" in updates[-1]
    # Each update carries only sections that differ from what the client last got (a clock shown on
    # the page may change one between two renders; an unchanged one is never sent again).
    last = sections_of(first)
    for update in updates:
        for name, html in sections_of(update).items():
            assert html != last[name], f"{name} was sent again unchanged"
            last[name] = html
    assert set(sections_of(updates[-1])) < set(sections_of(first))


def finish_a_page(job, pod) -> None:
    now = timezone.now()
    page = job.pages.filter(status=Page.Status.PENDING).order_by("number").first()
    Page.objects.filter(pk=page.pk).update(status=Page.Status.DONE, pod=pod, seconds=5.0,
                                           started_at=now - timedelta(seconds=5), finished_at=now)  # fmt: skip


def test_a_job_that_moved_is_pushed_as_its_own_row(fleet, admin_user):
    cookie = session_cookie(admin_user)
    row = f'id="job-{fleet.mallorys_job.pk}"'

    async def scenario():
        comm = communicator(cookie)
        assert (await comm.connect(timeout=GUARD))[0]
        messages = [await comm.receive_from(timeout=GUARD)]
        await asyncio.to_thread(finish_a_page, fleet.mallorys_job, fleet.ready)
        while len(messages) == 1 or row not in messages[-1]:  # until the job's progress is pushed
            messages.append(await comm.receive_from(timeout=GUARD))
        await comm.disconnect()
        return messages

    first, *updates = run(scenario)

    assert row in first and "dash-jobs" in ids_in(first)
    moved = updates[-1]
    # the row alone, swapped by its id; the table and the other jobs' rows are not sent again
    assert moved.startswith(f'<tr hx-swap-oob="true" {row}')
    assert re.search(rf'<tr hx-swap-oob="true" {row}.*?<span class="pages-done">1</span> / 3 pages', moved, re.S)
    assert "dash-jobs" not in ids_in(moved) and 'id="dash-jobs"' not in moved
    assert f'id="job-{fleet.bobs_job.pk}"' not in moved and f'id="job-{fleet.admins_job.pk}"' not in moved


def test_rows_alone_are_sent_only_while_the_table_holds_the_same_jobs_in_the_same_order():
    old = RowsSection("<section>a</section>", rows={"job-1": '<tr id="job-1">1</tr>'}, frame=(True, ("job-1",)))
    same_jobs = RowsSection("<section>b</section>", rows={"job-1": "<tr id=\"job-1\">2</tr>"},
                                     frame=(True, ("job-1",)))  # fmt: skip
    more_jobs = RowsSection("<section>c</section>", rows={"job-2": "<tr id=\"job-2\">0</tr>",
                                     "job-1": "<tr id=\"job-1\">2</tr>"}, frame=(True, ("job-2", "job-1")))  # fmt: skip

    assert broadcast.changed_parts(old, old) == ([], [])
    assert broadcast.changed_parts(old, same_jobs) == ([], ['<tr hx-swap-oob="true" id="job-1">2</tr>'])
    assert broadcast.changed_parts(same_jobs, more_jobs) == ([more_jobs], [])
    assert broadcast.changed_parts(None, old) == ([old], [])
    # rows travel in a message of their own, which begins with them (htmx drops a <tr> after a <section>)
    live = '<span id="dash-live">2</span>'
    assert broadcast.messages_for({"live": "<span>1</span>", "jobs": old}, {"live": live, "jobs": same_jobs}) == [
        live,
        '<tr hx-swap-oob="true" id="job-1">2</tr>',
    ]


def test_one_broadcaster_renders_for_every_client_at_most_once_a_second(fleet, admin_user, ordinary_user, monkeypatch):
    renders = []
    real = dashboard.render_payloads

    def counting(**kwargs):
        renders.append(kwargs)
        return real(**kwargs)

    monkeypatch.setattr(dashboard, "render_payloads", counting)

    cookies = [session_cookie(user) for user in (admin_user, admin_user, ordinary_user)]

    async def scenario():
        clients = [communicator(cookie) for cookie in cookies]
        loop = asyncio.get_running_loop()
        started = loop.time()
        for comm in clients:
            assert (await comm.connect(timeout=GUARD))[0]
        received = await asyncio.gather(*(messages_for(comm, 2.5) for comm in clients))
        task = broadcast.broadcaster().task
        for comm in clients:
            await comm.disconnect()
        await asyncio.wait_for(task, GUARD)
        return received, loop.time() - started

    received, elapsed = run(scenario)

    assert all(messages for messages in received)
    assert 1 <= len(renders) <= int(elapsed) + 1
    # one render served both kinds of audience at once
    assert {"staff": True, "user_ids": [ordinary_user.pk], "front": broadcast.PROCESS_ID} in renders


def log_out(cookie: tuple[bytes, bytes]) -> None:
    client = Client()
    client.cookies["sessionid"] = cookie[1].decode().split("=", 1)[1]
    assert client.post("/logout/").status_code == 302


def deactivate(user) -> None:
    user.is_active = False
    user.save(update_fields=["is_active"])


def change_password(user) -> None:
    user.set_password("a-new-pass-2")
    user.save(update_fields=["password"])


def take_staff(user) -> None:
    user.is_staff = False
    user.save(update_fields=["is_staff"])


async def closed_with(comm: WebsocketCommunicator, seconds: float) -> int | None:
    """The close code the client got within a while, reading past the updates; None if still open."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while loop.time() < deadline:
        if not await comm.receive_nothing(timeout=0.1, interval=0.02):
            output = await comm.receive_output(timeout=GUARD)
            if output["type"] == "websocket.close":
                return output["code"]
    return None


@pytest.mark.parametrize(
    "end_session", [log_out, deactivate, change_password, take_staff], ids=lambda f: f.__name__
)  # fmt: skip
def test_a_websocket_is_closed_when_its_session_no_longer_logs_its_user_in(fleet, admin_user, ordinary_user,
                                                                          monkeypatch, end_session):  # fmt: skip
    monkeypatch.setattr(broadcast, "SESSION_CHECK_SECONDS", 0.2)
    ended, kept = session_cookie(admin_user), session_cookie(ordinary_user)
    ended_other_tab = session_cookie(admin_user) if end_session is log_out else None  # another session of alice's

    async def scenario():
        comms = {name: communicator(cookie) for name, cookie in
                 [("ended", ended), ("kept", kept), ("other tab", ended_other_tab)] if cookie}  # fmt: skip
        for comm in comms.values():
            assert (await comm.connect(timeout=GUARD))[0]
            await comm.receive_from(timeout=GUARD)  # the first full payload: it is live
        await database_sync_to_async(end_session)(ended if end_session is log_out else admin_user)

        assert await closed_with(comms["ended"], GUARD) == 4401
        assert await closed_with(comms["kept"], 1.0) is None  # five checks later: bob's stays open
        if "other tab" in comms:
            assert await closed_with(comms["other tab"], 0.1) is None  # a logout ends its own session only
        for name, comm in comms.items():
            if name != "ended":
                await comm.disconnect()

    run(scenario)


def test_groups_belong_to_this_process():
    staff = broadcast.Subscriber(user_id=1, is_staff=True)
    other = broadcast.Subscriber(user_id=7, is_staff=False)

    assert staff.group == f"dashboard.{broadcast.PROCESS_ID}.staff"
    assert other.group == f"dashboard.{broadcast.PROCESS_ID}.user.7"


# --- real fronts ---------------------------------------------------------------------------------


@pytest.fixture
def two_fronts(transactional_db, tmp_path):
    """Two daphne processes on the test database and the configured channel layer (channels_redis
    when REDIS_URL is set: then they share it, as fronts on several hosts do)."""
    fronts = []
    for name in ("a", "b"):
        var_dir = tmp_path / name
        var_dir.mkdir()
        fronts.append(start_front(child_env(var_dir), var_dir))
    yield [url for _, url in fronts]
    for process, _ in fronts:
        process.stop()


async def collect(url: str, cookie: str | None, seconds: float) -> tuple[list[str], int | None]:
    """Messages a websocket client of ``url`` receives for a while, and the close code if closed."""
    headers = {"Origin": url}
    if cookie:
        headers["Cookie"] = f"sessionid={cookie}"
    received: list[str] = []
    async with aiohttp.ClientSession() as session:
        async with session.ws_connect(f"{url}/ws/dashboard", headers=headers) as ws:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + seconds
            while (left := deadline - loop.time()) > 0:
                try:
                    message = await ws.receive(timeout=left)
                except TimeoutError:
                    break
                if message.type == aiohttp.WSMsgType.TEXT:
                    received.append(message.data)
                elif message.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.CLOSING):
                    return received, ws.close_code
    return received, None


@pytest.mark.e2e
def test_each_front_sends_only_its_own_renders_to_its_own_clients(two_fronts, fleet, admin_user):
    session = session_cookie(admin_user)[1].decode().split("=", 1)[1]

    async def both():
        return await asyncio.gather(*(collect(url, session, 3.5) for url in two_fronts))

    (a, _), (b, _) = asyncio.run(both())

    fronts_a = {m for message in a for m in re.findall(r'data-front="([0-9a-f]+)"', message)}
    fronts_b = {m for message in b for m in re.findall(r'data-front="([0-9a-f]+)"', message)}
    assert a and b
    assert len(fronts_a) == 1 and len(fronts_b) == 1, (fronts_a, fronts_b)  # nobody hears the other front
    assert fronts_a != fronts_b


@pytest.mark.e2e
def test_a_real_front_closes_an_anonymous_websocket_with_4401(two_fronts, fleet):
    received, code = asyncio.run(collect(two_fronts[0], None, 5))

    assert received == []
    assert code == 4401
