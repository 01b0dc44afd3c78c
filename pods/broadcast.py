"""One broadcaster per front process: the dashboard rendered at most once a second, sent to
this process's websocket clients.

The first consumer on a loop starts it (an asyncio task on the front's loop);
it stops when the last one leaves. Reads and rendering run on a thread of
their own, never on the loop. Each tick renders one variant for staff and one
per connected non-staff user, and sends each audience only the sections that
changed since its last message; of the jobs table, only the rows that changed.

Every SESSION_CHECK_SECONDS it checks each client's session again and closes the
websockets of those logged out (4401).

The same loop runs the feeds other apps register (``register_feed``): the live job pages
(ocrjobs/live.py), each at its own pace, their reads on the same thread.

Groups carry this process's id, so with channels_redis and several fronts each
front renders for its own clients and nobody gets another front's copy.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from importlib import import_module
from types import SimpleNamespace

from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from django.conf import settings
from django.contrib.auth import get_user

from pods import dashboard
from pods.sections import RowsSection, out_of_band

log = logging.getLogger(__name__)

PROCESS_ID = uuid.uuid4().hex[:12]
INTERVAL_SECONDS = 1.0
# Channel layers drop group members after a day (group_expiry); dashboards stay open longer.
GROUP_REFRESH_SECONDS = 3600.0
# How often each client's session is checked again: a logout, an expired session, a deactivated
# user or a changed password ends its websocket within this time, on whichever front holds it.
SESSION_CHECK_SECONDS = 5.0

# One thread for the dashboard's reads and rendering: it never takes a thread
# that requests or other sync_to_async callers wait for.
_executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dashboard")


async def run_in_render_thread(function: Callable, *args):
    """``function(*args)`` on the broadcaster's thread, with its database connection."""
    return await database_sync_to_async(function, thread_sensitive=False, executor=_executor)(*args)


# Feeds other apps push from this loop, each at its own pace (ocrjobs' live job pages,
# ocrjobs/live.py, registered in ocrjobs/apps.py): an object with watching(), subscribers(),
# groups(), unwatch(channel) and async tick(layer, now=).
_feed_kinds: list[type] = []


def register_feed(kind: type) -> None:
    if kind not in _feed_kinds:
        _feed_kinds.append(kind)


@dataclass(frozen=True)
class Subscriber:
    user_id: int
    is_staff: bool
    session_key: str | None = None

    @property
    def audience(self) -> str:
        return dashboard.audience_for(user_id=self.user_id, staff=self.is_staff)

    @property
    def group(self) -> str:
        return group_for(self.audience)


def group_for(audience: str) -> str:
    return f"dashboard.{PROCESS_ID}.{audience.replace(':', '.')}"


def sessions_ended(subscribers: dict[str, Subscriber]) -> list[str]:
    """The channels whose session no longer logs their user in as they connected: logged out,
    expired, the user deactivated, their password changed, or made staff or no longer staff."""
    store = import_module(settings.SESSION_ENGINE).SessionStore
    users = {
        key: get_user(SimpleNamespace(session=store(key))) for key in {s.session_key for s in subscribers.values()}
    }
    return [
        channel_name
        for channel_name, subscriber in subscribers.items()
        if users[subscriber.session_key].pk != subscriber.user_id
        or bool(users[subscriber.session_key].is_staff) != subscriber.is_staff
    ]


class Broadcaster:
    def __init__(self) -> None:
        self.subscribers: dict[str, Subscriber] = {}
        self.sent: dict[str, dict[str, str]] = {}  # audience -> section -> the HTML it last got
        self.task: asyncio.Task | None = None
        self.ticks = 0
        self.feeds = [kind() for kind in _feed_kinds]

    def feed(self, kind: type):
        return next(feed for feed in self.feeds if isinstance(feed, kind))

    def start(self) -> None:
        if self.task is None or self.task.done():
            self.task = asyncio.get_running_loop().create_task(self._run(), name="dashboard-broadcaster")

    def _active(self) -> bool:
        return bool(self.subscribers) or any(feed.watching() for feed in self.feeds)

    def subscribe(self, channel_name: str, subscriber: Subscriber) -> None:
        self.subscribers[channel_name] = subscriber
        # The newcomer's page may be older than the last message: its audience gets everything.
        self.sent.pop(subscriber.audience, None)
        self.start()

    def unsubscribe(self, channel_name: str) -> None:
        self.subscribers.pop(channel_name, None)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        layer = get_channel_layer()
        render = database_sync_to_async(dashboard.render_payloads, thread_sensitive=False, executor=_executor)
        check = database_sync_to_async(sessions_ended, thread_sensitive=False, executor=_executor)
        refreshed = checked = loop.time()
        log.info("dashboard broadcaster %s started", PROCESS_ID)
        while self._active():
            started = loop.time()
            audiences = {s.audience for s in self.subscribers.values()}
            user_ids = sorted({s.user_id for s in self.subscribers.values() if not s.is_staff})
            try:
                if started - checked >= SESSION_CHECK_SECONDS:
                    checked = started
                    everyone = dict(self.subscribers)
                    for feed in self.feeds:
                        everyone.update(feed.subscribers())
                    for channel_name in await check(everyone):
                        self.unsubscribe(channel_name)
                        for feed in self.feeds:
                            feed.unwatch(channel_name)
                        await layer.send(channel_name, {"type": "session.ended"})
                    if not self._active():
                        break
                if self.subscribers:
                    payloads = await render(staff=dashboard.STAFF in audiences, user_ids=user_ids, front=PROCESS_ID)
                    await self._send(layer, payloads, audiences)
                for feed in self.feeds:
                    await feed.tick(layer, now=started)
                if started - refreshed > GROUP_REFRESH_SECONDS:
                    refreshed = started
                    for channel_name, subscriber in list(self.subscribers.items()):
                        await layer.group_add(subscriber.group, channel_name)
                    for feed in self.feeds:
                        for channel_name, group in feed.groups().items():
                            await layer.group_add(group, channel_name)
            except Exception:
                log.exception("dashboard broadcast failed; trying again next tick")
            self.ticks += 1
            await asyncio.sleep(max(0.0, INTERVAL_SECONDS - (loop.time() - started)))
        self.sent.clear()
        log.info("dashboard broadcaster %s stopped: no clients", PROCESS_ID)

    async def _send(self, layer, payloads: dict[str, dict[str, str]], audiences: set[str]) -> None:
        for audience in list(self.sent):
            if audience not in audiences:
                del self.sent[audience]
        for audience, sections in payloads.items():
            if audience not in audiences:
                continue  # left while we rendered
            last = self.sent.setdefault(audience, {})
            for message in messages_for(last, sections):
                await layer.group_send(group_for(audience), {"type": "dashboard.html", "html": message})
            last.update(sections)


def changed_parts(last: str | None, html: str) -> tuple[list[str], list[str]]:
    """What a client that last got ``last`` of a section needs to show ``html``, as (sections,
    rows): nothing; the rows that changed, each swapped on its own, when the section holds the
    same rows as before (a job's progress moved); or the whole section."""
    if last == html:
        return [], []
    if isinstance(html, RowsSection) and isinstance(last, RowsSection) and last.frame == html.frame:
        return [], [out_of_band(row) for key, row in html.rows.items() if last.rows[key] != row]
    return [html], []


def messages_for(last: dict[str, str], sections: dict[str, str]) -> list[str]:
    """The messages that take a client from the sections it ``last`` got to ``sections``. Rows go
    in a message of their own: the browser parses a message as the content of a <template>,
    whose first tag decides the rest, and a <tr> after a <section> would be dropped."""
    whole, rows = [], []
    for name, html in sections.items():
        changed_sections, changed_rows = changed_parts(last.get(name), html)
        whole += changed_sections
        rows += changed_rows
    return ["".join(part) for part in (whole, rows) if part]


_broadcasters: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Broadcaster] = weakref.WeakKeyDictionary()


def broadcaster() -> Broadcaster:
    """This loop's broadcaster (a front has one loop; tests start a loop per test)."""
    loop = asyncio.get_running_loop()
    found = _broadcasters.get(loop)
    if found is None:
        found = _broadcasters[loop] = Broadcaster()
    return found
