from django.contrib import admin

from accounts.models import ApiToken


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ("name", "user", "scopes", "created_at", "last_used_at")
    readonly_fields = ("token_hash", "created_at", "last_used_at")
