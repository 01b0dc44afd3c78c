"""Pages for people: the job form, the job list and a job's page."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.http import require_POST

from fleetadmin.errors import DomainError
from ocrjobs import live, selectors
from ocrjobs.forms import JobForm, JobListFilters
from ocrjobs.models import Job, KeptUpload
from ocrjobs.schemas import job_submit_arguments
from ocrjobs.services import jobs as job_services
from ocrjobs.services import kept_uploads, outputs
from ocrjobs.services.budgets import budget_left
from ocrjobs.services.submission import Upload, job_submit
from ocrjobs.viewer_views import viewer_first_render
from pods.audit import Actor
from pods.dashboard import jobs_with_cost
from pods.models import AuditEntry


def _job_for(request: HttpRequest, job_id: int) -> Job:
    job = selectors.jobs_visible_to(request.user).select_related("owner").filter(pk=job_id).first()
    if job is None:
        raise Http404("no such job")
    return job


JOBS_PER_PAGE = 25


@login_required
def job_list(request: HttpRequest) -> HttpResponse:
    """The user's jobs (everybody's for staff), newest first, JOBS_PER_PAGE a page, searched by
    document name and filtered by status, pool, owner and date. A fixed number of queries a page,
    whatever the number of jobs or documents (tests/ocrjobs/test_job_list.py)."""
    filters = JobListFilters(request.GET, staff=request.user.is_staff)
    if not filters.is_valid():
        context = {"filters": filters, "page": None, "rows": []}
        return render(request, "ocrjobs/job_list.html", context, status=400)
    jobs = selectors.jobs_for_list(filters.filter(selectors.jobs_visible_to(request.user)))
    page = Paginator(jobs, JOBS_PER_PAGE).get_page(request.GET.get("page"))
    rows = jobs_with_cost(list(page.object_list), now=timezone.now())
    names = selectors.first_document_names([row.job.pk for row in rows])
    for row in rows:
        row.names = names[row.job.pk]
        row.more_documents = row.job.documents_count - len(row.names)
    query = request.GET.copy()
    query.pop("page", None)
    context = {"filters": filters, "page": page, "rows": rows, "query": query.urlencode(),
               "filtered": any(filters.cleaned_data.values())}  # fmt: skip
    return render(request, "ocrjobs/job_list.html", context)


@login_required
def job_new(request: HttpRequest) -> HttpResponse:
    """The form. A refused submit shows it again with every field as sent and every file kept
    (ocrjobs/services/kept_uploads.py): those kept before and still ticked, and those just chosen."""
    form = JobForm(request.POST or None, request.FILES or None, user=request.user)
    kept: list = []
    if request.method == "POST":
        shown = kept_uploads.uploads_kept(owner=request.user, ids=request.POST.getlist("kept"))
        kept_uploads.uploads_drop(KeptUpload.objects.filter(owner=request.user).exclude(pk__in=[k.pk for k in shown]))
        kept = shown + kept_uploads.uploads_keep(
            owner=request.user, files=[f for f in request.FILES.getlist("files") if f]
        )
        if form.is_valid():
            try:
                arguments = job_submit_arguments(form.cleaned_data["submission"])
                job = job_submit(owner=request.user, uploads=kept_uploads.uploads_of(kept), **arguments)
            except DomainError as exc:
                form.add_error(None, exc.message)
            else:
                kept_uploads.uploads_drop(kept)
                messages.success(request, f"Job {job.pk} submitted.")
                return redirect(job)
    status = 400 if form.errors else 200
    context = {"form": form, "kept": kept, "budget": budget_left(request.user)}
    return render(request, "ocrjobs/job_new.html", context, status=status)


@login_required
@require_POST
def job_forecast(request: HttpRequest) -> HttpResponse:
    """The form's forecast, shown by htmx once files are chosen: the files are checked and
    counted as on submission; nothing is stored."""
    form = JobForm(request.POST, request.FILES, user=request.user)
    context: dict = {"forecast": None, "forecast_error": ""}
    if not form.is_valid():
        context["forecast_error"] = "; ".join(str(e) for errors in form.errors.values() for e in errors)
    else:
        kept = kept_uploads.uploads_kept(owner=request.user, ids=request.POST.getlist("kept"))
        uploads = kept_uploads.uploads_of(kept) + [Upload(name=f.name, file=f) for f in form.cleaned_data["files"]]
        try:
            arguments = job_submit_arguments(form.cleaned_data["submission"])
            context["forecast"] = job_submit(owner=request.user, uploads=uploads, dry_run=True, **arguments)
        except DomainError as exc:
            context["forecast_error"] = exc.message
    return render(request, "partials/job_forecast.html", context)


@login_required
def job_detail(request: HttpRequest, job_id: int) -> HttpResponse:
    """The job, its documents, and the page viewer's first batch of pages (ocrjobs/viewer.py):
    only the results of the pages shown are read, whatever the job's size; the browser asks for
    the next batch as it scrolls."""
    job = _job_for(request, job_id)
    context = live.job_context(job)
    context["viewer_user_id"] = request.user.pk
    context.update(viewer_first_render(request, job))
    return render(request, "ocrjobs/job_detail.html", context)


@login_required
def job_progress(request: HttpRequest, job_id: int) -> HttpResponse:
    """The job page's live sections as out-of-band fragments: what the websocket pushes
    (ocrjobs/live.py), for a page without one. The page never reloads itself: a message shown
    above it (a retry's) stays."""
    job = _job_for(request, job_id)
    context = live.job_context(job)
    sections = live.render_group_sections(context)
    return HttpResponse(live.render_actions(context, user_id=request.user.pk) + "".join(sections.values()))


def _actor(request: HttpRequest) -> Actor:
    return Actor(user=request.user, door=AuditEntry.Door.PAGE)


@login_required
@require_POST
def job_cancel(request: HttpRequest, job_id: int) -> HttpResponse:
    job = job_services.job_cancel(job=_job_for(request, job_id), actor=_actor(request))
    messages.info(request, f"Job {job.pk} cancelled.")
    return redirect(job)


@login_required
@require_POST
def job_outputs_rebuild(request: HttpRequest, job_id: int) -> HttpResponse:
    job = _job_for(request, job_id)
    if job.owner_id != request.user.pk:
        raise PermissionDenied("only the job's owner may rebuild its outputs")
    try:
        documents = outputs.job_outputs_rebuild(job=job, user=request.user)
    except DomainError as exc:
        messages.error(request, exc.message)
    else:
        messages.info(request, f"The searchable PDFs of {documents} documents are being built.")
    return redirect(job)


@login_required
@require_POST
def job_retry(request: HttpRequest, job_id: int) -> HttpResponse:
    job = _job_for(request, job_id)
    try:
        pages, documents = job_services.job_retry(job=job, actor=_actor(request))
    except DomainError as exc:  # the owner's daily budget is used
        messages.error(request, exc.message)
        return redirect(job)
    messages.info(request, f"{pages} failed pages and {documents} failed documents queued again.")
    return redirect(job)
