from django.contrib import admin, messages

from fleetadmin.errors import DomainError
from ocrjobs.models import Dispatcher, Document, Job, Page
from ocrjobs.services import jobs as job_services
from pods.audit import Actor
from pods.models import AuditEntry


class DocumentInline(admin.TabularInline):
    model = Document
    extra = 0
    fields = ("position", "name", "kind", "page_count", "status", "error")
    readonly_fields = fields


@admin.register(Job)
class JobAdmin(admin.ModelAdmin):
    list_display = ("id", "owner", "pool", "status", "created_at", "finished_at")
    list_filter = ("status", "pool")
    inlines = [DocumentInline]
    actions = ["cancel", "retry"]

    @admin.action(description="Cancel the selected jobs")
    def cancel(self, request, queryset):
        actor = Actor(user=request.user, door=AuditEntry.Door.ADMIN)
        for job in queryset.exclude(status__in=Job.FINISHED):
            job_services.job_cancel(job=job, actor=actor)
            self.message_user(request, f"Job {job.pk} cancelled.")

    @admin.action(description="Retry the failed pages and documents of the selected jobs")
    def retry(self, request, queryset):
        actor = Actor(user=request.user, door=AuditEntry.Door.ADMIN)
        for job in queryset.filter(status__in=[Job.Status.PARTIAL, Job.Status.FAILED]):
            try:
                pages, documents = job_services.job_retry(job=job, actor=actor)
            except DomainError as exc:
                self.message_user(request, f"Job {job.pk}: {exc.message}", messages.ERROR)
            else:
                self.message_user(request, f"Job {job.pk}: {pages} pages and {documents} documents queued again.")


@admin.register(Document)
class DocumentAdmin(admin.ModelAdmin):
    list_display = ("id", "job", "name", "kind", "page_count", "status")
    list_filter = ("status", "kind")


@admin.register(Page)
class PageAdmin(admin.ModelAdmin):
    list_display = ("id", "job", "document", "number", "status", "attempts", "pod", "confidence")
    list_filter = ("status",)
    raw_id_fields = ("job", "document", "pod")


@admin.register(Dispatcher)
class DispatcherAdmin(admin.ModelAdmin):
    list_display = ("id", "pool", "host", "pid", "started_at", "heartbeat_at", "ended_at", "pages_done", "pages_failed")
