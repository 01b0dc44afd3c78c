"""The dashboard pages: the live fleet view, its fragments, and the release button."""

from __future__ import annotations

import logging

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, HttpResponseForbidden
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from pods import dashboard
from pods.audit import Actor
from pods.models import AuditEntry, Pod
from pods.services import lifecycle

log = logging.getLogger(__name__)


@login_required
def dashboard_page(request: HttpRequest) -> HttpResponse:
    context = dashboard.page_context(request.user, pod_page_number=_page_number(request, "pods"))
    return render(request, "pods/dashboard.html", context)


def _page_number(request: HttpRequest, name: str) -> int:
    try:
        return int(request.GET.get(name, "1"))
    except ValueError:
        return 1


@login_required
def dashboard_sections(request: HttpRequest) -> HttpResponse:
    """Every section as out-of-band fragments: what the websocket sends, for a page without one."""
    context = dashboard.page_context(request.user)
    fragments = dashboard.render_sections(context["sections"], context)
    return HttpResponse("".join(fragments.values()))


@login_required
def dashboard_pods(request: HttpRequest) -> HttpResponse:
    """One page of every live pod, asked for by the page (htmx), never pushed: the websocket
    carries only the summary by pool, state and GPU type, whatever the fleet's size."""
    context = {**dashboard.pod_page(page=_page_number(request, "page")), "is_staff": bool(request.user.is_staff)}
    return render(request, "partials/dash_pod_list.html", context)


@require_POST
def pod_release(request: HttpRequest, pod_id: int) -> HttpResponse:
    """Release the pod as the API does: ended now, its spend attributed, terminated at the
    provider by a pass. Staff only; idempotent."""
    if not (request.user.is_authenticated and request.user.is_staff):
        return HttpResponseForbidden("releasing a pod is for staff only")
    pod = get_object_or_404(Pod.objects.select_related("pool"), pk=pod_id)
    actor = Actor(user=request.user, door=AuditEntry.Door.PAGE)
    if lifecycle.pod_release(pod=pod, reason=f"dashboard: {request.user.get_username()}", actor=actor):
        log.info("release of %s requested by %s", pod.name, request.user.get_username())
        message = "release requested"
    else:
        pod.refresh_from_db()
        message = f"{pod.name} is already {pod.state}"
    if request.headers.get("HX-Request") == "true":
        return render(request, "partials/pod_release_requested.html", {"pod": pod, "message": message})
    messages.info(request, f"{pod.name}: {message}.")
    return redirect("home")
