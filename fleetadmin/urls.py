from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.core.exceptions import RequestDataTooBig, TooManyFieldsSent, TooManyFilesSent
from django.http import JsonResponse
from django.templatetags.static import static
from django.urls import path
from django.views import defaults
from django.views.generic import RedirectView

from fleetadmin import metrics, openapi
from ocrjobs import api as jobs_api
from ocrjobs import downloads as jobs_downloads
from ocrjobs import viewer_views
from ocrjobs import views as jobs_views
from pods import api as pods_api
from pods import views as pods_views


def not_found(request, exception=None):
    """The API answers an unknown path in its own error shape; pages get Django's 404 page."""
    if request.path.startswith("/v1/"):
        return JsonResponse({"error": f"no endpoint at {request.path}"}, status=404)
    return defaults.page_not_found(request, exception)


handler404 = not_found


def bad_request(request, exception=None):
    """Under /v1/ every error is JSON: a body past Django's memory limits (RequestDataTooBig,
    TooManyFieldsSent, TooManyFilesSent, raised on first touch of request.body or POST) is a
    413, any other SuspiciousOperation a 400. Pages keep Django's own 400 page."""
    if request.path.startswith("/v1/"):
        if isinstance(exception, (RequestDataTooBig, TooManyFieldsSent, TooManyFilesSent)):
            return JsonResponse({"error": f"the request is too large: {exception}"}, status=413)
        return JsonResponse({"error": f"bad request: {exception or 'the request cannot be read'}"}, status=400)
    return defaults.bad_request(request, exception)


def permission_denied(request, exception=None):
    if request.path.startswith("/v1/"):
        return JsonResponse({"error": f"forbidden: {exception or 'permission denied'}"}, status=403)
    return defaults.permission_denied(request, exception)


def server_error(request):
    if request.path.startswith("/v1/"):
        return JsonResponse({"error": "internal error; it has been logged"}, status=500)
    return defaults.server_error(request)


handler400 = bad_request
handler403 = permission_denied
handler500 = server_error


async def healthz(request):
    # Touches no database and no thread: it answers as long as the front's loop runs.
    return JsonResponse({"status": "ok"})


urlpatterns = [
    path("", pods_views.dashboard_page, name="home"),
    path("dashboard/sections", pods_views.dashboard_sections, name="dashboard-sections"),
    path("dashboard/pods", pods_views.dashboard_pods, name="dashboard-pods"),
    path("pods/<int:pod_id>/release", pods_views.pod_release, name="pods-release"),
    path("healthz", healthz, name="healthz"),
    # Pages name their icon (base.html); this answers what asks the conventional path (the admin's pages).
    path("favicon.ico", RedirectView.as_view(url=static("favicon.svg"), permanent=True), name="favicon"),
    path("metrics", metrics.metrics, name="metrics"),
    path("login/", auth_views.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("admin/", admin.site.urls),
    path("jobs/", jobs_views.job_list, name="jobs-list"),
    path("jobs/new", jobs_views.job_new, name="jobs-new"),
    path("jobs/forecast", jobs_views.job_forecast, name="jobs-forecast"),
    path("jobs/<int:job_id>", jobs_views.job_detail, name="jobs-detail"),
    path("jobs/<int:job_id>/progress", jobs_views.job_progress, name="jobs-progress"),
    path("jobs/<int:job_id>/cancel", jobs_views.job_cancel, name="jobs-cancel"),
    path("jobs/<int:job_id>/outputs/rebuild", jobs_views.job_outputs_rebuild, name="jobs-outputs-rebuild"),
    path("jobs/<int:job_id>/retry", jobs_views.job_retry, name="jobs-retry"),
    path("jobs/<int:job_id>/viewer", viewer_views.job_viewer_batch, name="jobs-viewer"),
    path("jobs/<int:job_id>/viewer/lines", viewer_views.job_viewer_lines, name="jobs-viewer-lines"),
    path("jobs/<int:job_id>/documents/<int:document_id>", viewer_views.job_document, name="jobs-document"),
    path(
        "jobs/<int:job_id>/pages/<int:page_id>/lines/<int:line>",
        viewer_views.job_line_correct,
        name="jobs-line-correct",
    ),
    path("v1/openapi.json", openapi.openapi_json, name="api-openapi"),
    path("v1/runpod/status", pods_api.status, name="api-runpod-status"),
    path("v1/runpod/prices", pods_api.prices, name="api-runpod-prices"),
    path("v1/runpod/scale", pods_api.scale, name="api-runpod-scale"),
    path("v1/runpod/scale/<int:request_id>", pods_api.scale_detail, name="api-runpod-scale-detail"),
    path("v1/runpod/release", pods_api.release, name="api-runpod-release"),
    path("v1/runpod/spend", pods_api.spend, name="api-runpod-spend"),
    path("v1/models", pods_api.models, name="api-models"),
    path("v1/jobs", jobs_api.jobs, name="api-jobs"),
    path("v1/jobs/<int:job_id>", jobs_api.job_detail, name="api-jobs-detail"),
    path("v1/webhooks/secret", jobs_api.webhook_secret, name="api-webhooks-secret"),
    path("v1/webhooks/secret/rotate", jobs_api.webhook_secret_rotate_view, name="api-webhooks-secret-rotate"),
    path("v1/jobs/<int:job_id>/pages", jobs_api.job_pages, name="api-jobs-pages"),
    path("v1/jobs/<int:job_id>/result.txt", jobs_api.job_result_txt, name="api-jobs-result-txt"),
    path("v1/jobs/<int:job_id>/result.jsonl", jobs_api.job_result_jsonl, name="api-jobs-result-jsonl"),
    path("v1/jobs/<int:job_id>/result.md", jobs_downloads.job_result_md, name="api-jobs-result-md"),
    path("v1/jobs/<int:job_id>/outputs.zip", jobs_downloads.job_outputs_zip, name="api-jobs-outputs-zip"),
    path(
        "v1/jobs/<int:job_id>/documents/<int:document_id>/result.txt",
        jobs_downloads.document_result_txt,
        name="api-documents-result-txt",
    ),
    path(
        "v1/jobs/<int:job_id>/documents/<int:document_id>/result.md",
        jobs_downloads.document_result_md,
        name="api-documents-result-md",
    ),
    path(
        "v1/jobs/<int:job_id>/documents/<int:document_id>/result.jsonl",
        jobs_downloads.document_result_jsonl,
        name="api-documents-result-jsonl",
    ),
    path(
        "v1/jobs/<int:job_id>/documents/<int:document_id>/result.hocr",
        jobs_downloads.document_result_hocr,
        name="api-documents-result-hocr",
    ),
    path(
        "v1/jobs/<int:job_id>/documents/<int:document_id>/result.alto.xml",
        jobs_downloads.document_result_alto,
        name="api-documents-result-alto",
    ),
    path(
        "v1/jobs/<int:job_id>/documents/<int:document_id>/result.pdf",
        jobs_downloads.document_result_pdf,
        name="api-documents-result-pdf",
    ),
    path("v1/jobs/<int:job_id>/cancel", jobs_api.job_cancel, name="api-jobs-cancel"),
    path("v1/jobs/<int:job_id>/outputs/rebuild", jobs_api.job_outputs_rebuild, name="api-jobs-outputs-rebuild"),
    path("v1/jobs/<int:job_id>/retry", jobs_api.job_retry, name="api-jobs-retry"),
    path("v1/jobs/<int:job_id>/pages/<int:page_id>/lines/<int:line>", jobs_api.job_line_correct, name="api-jobs-line"),
]
