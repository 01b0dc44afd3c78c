from django.apps import AppConfig


class OcrjobsConfig(AppConfig):
    name = "ocrjobs"
    verbose_name = "OCR jobs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # function-level: the services import models, which load only once the app registry is ready
        from ocrjobs import registrations

        registrations.register()  # pass work, the job pages' feed, pods.hooks
