from django.apps import AppConfig


class OcrjobsConfig(AppConfig):
    name = "ocrjobs"
    verbose_name = "OCR jobs"
    default_auto_field = "django.db.models.BigAutoField"
