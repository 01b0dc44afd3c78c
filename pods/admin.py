from django.conf import settings
from django.contrib import admin, messages

from pods.audit import Actor
from pods.models import Alert, AuditEntry, BootAttempt, CapacityVerdict, Pod, Pool, PriceCatalogue
from pods.services import lifecycle


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


class ReadOnlyAdmin(admin.ModelAdmin):
    """Rows the system writes: staff look, and act only through the actions, which go through
    the same services as the dashboard and the API."""

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


class AuditEntryInline(admin.TabularInline):
    model = AuditEntry
    fk_name = "pod"
    extra = 0
    fields = ("at", "actor_name", "action", "door", "detail")
    readonly_fields = fields
    can_delete = False

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False


@admin.register(Pod)
class PodAdmin(ReadOnlyAdmin):
    """Read-only (issue 42: staff could edit a pod's state, lease token and base URL): a pod
    changes only through its services. Release and Terminate leave an audit entry each."""

    list_display = (
        "name", "pool", "state", "reason", "lanes", "gpu_type", "host", "cost_per_hr", "created_at", "ready_at"
    )  # fmt: skip
    list_filter = ("pool", "state", "host")
    search_fields = ("name", "provider_id")
    exclude = ("task_lease_token",)
    inlines = [AuditEntryInline]
    actions = ["release", "terminate"]

    def has_release_permission(self, request) -> bool:
        """Release and Terminate are for whoever may see the pods here and is staff, as the
        dashboard's button (the model itself is read-only for everybody)."""
        return request.user.is_active and request.user.is_staff

    def _act(self, request, queryset, service, verb: str) -> None:
        actor = Actor(user=request.user, door=AuditEntry.Door.ADMIN)
        reason = f"admin: {request.user.get_username()}"
        done = [pod.name for pod in queryset.select_related("pool") if service(pod=pod, reason=reason, actor=actor)]
        skipped = queryset.count() - len(done)
        if done:
            self.message_user(request, f"{verb}: {', '.join(done)}.", messages.SUCCESS)
        if skipped:
            self.message_user(request, f"{skipped} pod(s) had nothing to {verb.lower()}.", messages.WARNING)

    @admin.action(description="Release the selected pods (ended now, terminated by a pass)", permissions=["release"])
    def release(self, request, queryset):
        self._act(request, queryset, lifecycle.pod_release, "Released")

    @admin.action(description="Terminate the selected pods at the provider", permissions=["release"])
    def terminate(self, request, queryset):
        self._act(request, queryset, lifecycle.pod_terminate, "Terminated")


@admin.register(AuditEntry)
class AuditEntryAdmin(ReadOnlyAdmin):
    list_display = ("at", "actor_name", "action", "door", "pod", "job", "detail")
    list_filter = ("action", "door")
    search_fields = ("actor_name", "pod__name", "detail")
    raw_id_fields = ("pod", "job", "actor")


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
