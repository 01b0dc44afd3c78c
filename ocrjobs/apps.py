from django.apps import AppConfig


class OcrjobsConfig(AppConfig):
    name = "ocrjobs"
    verbose_name = "OCR jobs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # function-level: the services import models, which load only once the app registry is ready
        from ocrjobs.live import JobFeed
        from ocrjobs.models import WebhookDelivery
        from ocrjobs.services import webhooks
        from pods.broadcast import register_feed
        from pods.services.passes import Work, register

        # Only claimed and sent to a short task of its own by a pass: a pass never waits on a receiver.
        register(Work("webhook", webhooks.deliveries_due, webhooks.delivery_send,
                      waiting=lambda now: WebhookDelivery.objects.due(now=now)))  # fmt: skip
        # The job pages, pushed from the front's broadcaster loop (the dashboard's).
        register_feed(JobFeed)
