from django.apps import AppConfig


class FleetadminConfig(AppConfig):
    """Project-wide pieces that need a table: the loop heartbeats."""

    name = "fleetadmin"
    verbose_name = "fleetadmin"
    default_auto_field = "django.db.models.BigAutoField"
