from django.apps import AppConfig


class PodsConfig(AppConfig):
    name = "pods"
    default_auto_field = "django.db.models.BigAutoField"
