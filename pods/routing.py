from __future__ import annotations

from django.urls import path

from pods.consumers import DashboardConsumer

websocket_urlpatterns = [
    path("ws/dashboard", DashboardConsumer.as_asgi(), name="ws-dashboard"),
]
