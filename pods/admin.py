from django.contrib import admin

from pods.models import Pod, Pool


@admin.register(Pool)
class PoolAdmin(admin.ModelAdmin):
    list_display = ("key", "provider", "min_pods", "max_pods", "lanes_per_pod", "max_parallel_boots", "idle_seconds")


@admin.register(Pod)
class PodAdmin(admin.ModelAdmin):
    list_display = ("name", "pool", "state", "reason", "lanes", "gpu_type", "cost_per_hr", "created_at", "ready_at")
    list_filter = ("pool", "state")
    search_fields = ("name", "provider_id")
    readonly_fields = ("created_at", "ready_at", "ended_at", "last_busy_at")
