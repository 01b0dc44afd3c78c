"""The dashboard's websocket: a logged-in user joins this front's group for their audience,
and this front's broadcaster sends it HTML fragments (pods/broadcast.py)."""

from __future__ import annotations

from channels.generic.websocket import AsyncWebsocketConsumer

from pods import broadcast

CLOSE_UNAUTHENTICATED = 4401


class DashboardConsumer(AsyncWebsocketConsumer):
    subscriber: broadcast.Subscriber | None = None

    async def __call__(self, scope, receive, send):
        try:
            return await super().__call__(scope, receive, send)
        finally:
            # Also when the consumer is cancelled without a disconnect (server shutdown, a dead
            # connection): the broadcaster must not render for a client that is gone.
            broadcast.broadcaster().unsubscribe(self.channel_name)

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated or not user.is_active:
            # Accept, then close with a code: a refused handshake reads as 1006 in the
            # browser, which the htmx ws extension would retry for ever.
            await self.accept()
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        session = self.scope.get("session")
        self.subscriber = broadcast.Subscriber(
            user_id=user.pk, is_staff=bool(user.is_staff), session_key=session.session_key if session else None
        )
        await self.channel_layer.group_add(self.subscriber.group, self.channel_name)
        await self.accept()
        broadcast.broadcaster().subscribe(self.channel_name, self.subscriber)

    async def disconnect(self, code: int) -> None:
        if self.subscriber is None:
            return
        broadcast.broadcaster().unsubscribe(self.channel_name)
        await self.channel_layer.group_discard(self.subscriber.group, self.channel_name)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        pass  # the page sends nothing; updates flow one way

    async def dashboard_html(self, event: dict) -> None:
        await self.send(text_data=event["html"])

    async def session_ended(self, event: dict) -> None:
        """The broadcaster found the session logged out (or its user changed): the page reloads
        on this code (static/dashboard.js), which takes it to the login page."""
        await self.close(code=CLOSE_UNAUTHENTICATED)
