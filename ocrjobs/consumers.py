"""The job page's websocket: the job's owner or staff join the job's group on this front, and the
broadcaster's job feed (ocrjobs/live.py) sends it the sections and viewer pages that changed."""

from __future__ import annotations

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer

from ocrjobs import selectors
from ocrjobs.live import JobFeed, group_for_job, parse_report
from pods import broadcast
from pods.consumers import CLOSE_UNAUTHENTICATED

CLOSE_FORBIDDEN = 4403


def may_watch(user, job_id: int) -> bool:
    """The job's owner, or staff: whoever may open its page."""
    return selectors.jobs_visible_to(user).filter(pk=job_id).exists()


class JobConsumer(AsyncWebsocketConsumer):
    group: str | None = None

    def _feed(self) -> JobFeed:
        return broadcast.broadcaster().feed(JobFeed)

    async def __call__(self, scope, receive, send):
        try:
            return await super().__call__(scope, receive, send)
        finally:
            if self.group is not None:  # (also when cancelled without a disconnect, as the dashboard's)
                self._feed().unwatch(self.channel_name)

    async def connect(self) -> None:
        user = self.scope.get("user")
        job_id = self.scope["url_route"]["kwargs"]["job_id"]
        # Accepted, then closed with a code: a refused handshake reads as 1006, which the htmx ws
        # extension retries for ever; it does not retry a 44xx.
        if user is None or not user.is_authenticated or not user.is_active:
            await self.accept()
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        if not await database_sync_to_async(may_watch)(user, job_id):
            await self.accept()
            await self.close(code=CLOSE_FORBIDDEN)
            return
        session = self.scope.get("session")
        subscriber = broadcast.Subscriber(
            user_id=user.pk, is_staff=bool(user.is_staff), session_key=session.session_key if session else None
        )
        self.group = group_for_job(job_id)
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()
        self._feed().watch(self.channel_name, subscriber, job_id)
        broadcast.broadcaster().start()

    async def disconnect(self, code: int) -> None:
        if self.group is None:
            return
        self._feed().unwatch(self.channel_name)
        await self.channel_layer.group_discard(self.group, self.channel_name)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        """The page says which viewer pages it holds, and in which state (static/job.js)."""
        report = parse_report(text_data) if self.group is not None else None
        if report is not None:
            self._feed().hold(self.channel_name, *report)

    async def job_html(self, event: dict) -> None:
        await self.send(text_data=event["html"])

    async def session_ended(self, event: dict) -> None:
        await self.close(code=CLOSE_UNAUTHENTICATED)
