from django.contrib import admin

from ocrjobs.models import Dispatcher, Document, Job, Page


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
