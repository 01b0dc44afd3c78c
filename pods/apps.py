from django.apps import AppConfig


class PodsConfig(AppConfig):
    name = "pods"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # function-level: the services import models, which load only once the app registry is ready
        from pods import registrations

        registrations.register()  # pass work, the workers' clock, /metrics
