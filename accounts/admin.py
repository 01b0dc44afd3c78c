from django.contrib import admin

from accounts.models import ApiToken, Budget


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ("name", "user", "scopes", "created_at", "last_used_at")
    readonly_fields = ("token_hash", "created_at", "last_used_at")


@admin.register(Budget)
class BudgetAdmin(admin.ModelAdmin):
    list_display = ("user", "dollars_per_day")
    raw_id_fields = ("user",)
