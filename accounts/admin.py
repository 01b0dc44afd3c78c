from django.contrib import admin

from accounts.models import ApiToken, Budget


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ("name", "user", "scopes", "created_at", "last_used_at")
    readonly_fields = ("token_hash", "created_at", "last_used_at")

    def get_readonly_fields(self, request, obj=None):
        # A token stays its user's: handing it to another user would hand them its scopes.
        return (*self.readonly_fields, "user") if obj is not None else self.readonly_fields


@admin.register(Budget)
class BudgetAdmin(admin.ModelAdmin):
    list_display = ("user", "dollars_per_day")
    raw_id_fields = ("user",)
