from django.conf import settings
from django.contrib import admin

from pods.models import Alert, BootAttempt, CapacityVerdict, Pod, Pool, PriceCatalogue


@admin.register(Pool)
class PoolAdmin(admin.ModelAdmin):
    list_display = ("key", "provider", "min_pods", "max_pods", "lanes_per_pod", "max_parallel_boots", "idle_seconds",
                    "autostop_seconds",
                    "max_dollars_per_hour", "staff_only")  # fmt: skip
    filter_horizontal = ("groups",)

    def get_form(self, request, obj=None, **kwargs):
        form = super().get_form(request, obj, **kwargs)

        class PoolForm(form):
            def clean(self):
                # Pool.clean (run after this) judges the escalation pool by the groups being
                # saved, which the instance has only once the form is saved.
                cleaned = super().clean()
                if cleaned.get("groups") is not None:
                    self.instance.groups_to_save = {group.pk for group in cleaned["groups"]}
                return cleaned

        return PoolForm

    def get_changeform_initial_data(self, request):
        # A new pool starts with a $/h cap (POOL_DEFAULT_DOLLARS_PER_HOUR); clearing it is a choice.
        return {
            "max_dollars_per_hour": settings.POOL_DEFAULT_DOLLARS_PER_HOUR,
            **super().get_changeform_initial_data(request),
        }


@admin.register(Pod)
class PodAdmin(admin.ModelAdmin):
    list_display = (
        "name", "pool", "state", "reason", "lanes", "gpu_type", "host", "cost_per_hr", "created_at", "ready_at"
    )  # fmt: skip
    list_filter = ("pool", "state", "host")
    search_fields = ("name", "provider_id")
    readonly_fields = ("created_at", "ready_at", "ended_at", "last_busy_at")


@admin.register(CapacityVerdict)
class CapacityVerdictAdmin(admin.ModelAdmin):
    list_display = ("key", "blocked_until", "probing_until", "reason", "updated_at")
    search_fields = ("key",)


@admin.register(BootAttempt)
class BootAttemptAdmin(admin.ModelAdmin):
    list_display = ("created_at", "pod", "candidate", "outcome", "seconds", "error")
    list_filter = ("outcome",)
    raw_id_fields = ("pod",)


@admin.register(PriceCatalogue)
class PriceCatalogueAdmin(admin.ModelAdmin):
    list_display = ("provider", "fetched_at", "fetches", "last_error")


@admin.register(Alert)
class AlertAdmin(admin.ModelAdmin):
    list_display = ("updated_at", "pool", "kind", "message", "count", "resolved_at")
    list_filter = ("kind", "resolved_at")
    actions = ["resolve"]

    @admin.action(description="Resolve the selected alerts")
    def resolve(self, request, queryset):
        from django.utils import timezone

        queryset.filter(resolved_at__isnull=True).update(resolved_at=timezone.now())
