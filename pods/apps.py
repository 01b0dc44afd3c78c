from django.apps import AppConfig


class PodsConfig(AppConfig):
    name = "pods"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # function-level: the services import models, which load only once the app registry is ready
        from pods.models import Pod, Pool, ScaleRequest
        from pods.services import autostop, boot, lifecycle, scale_requests, scaler
        from pods.services.passes import Work, register

        # A pod whose step time has come is due a boot step or a terminate step: one `waiting` for both.
        register(Work("boot", boot.boots_due, boot.boot_step, waiting=lambda now: Pod.objects.filter(step_at__lte=now)))
        register(Work("terminate", lifecycle.terminations_due, lifecycle.terminate_step))
        register(Work("keepalive", autostop.keepalives_due, autostop.keepalive_step,
                      waiting=autostop.keepalives_waiting))  # fmt: skip
        register(Work("shed tick", scaler.shed_ticks_due, scaler.shed_tick_step,
                      waiting=lambda now: Pool.objects.filter(shed_tick_at__lte=now)))  # fmt: skip
        register(Work("scale request", scale_requests.scale_requests_due, scale_requests.scale_request_step,
                      waiting=lambda now: ScaleRequest.objects.filter(state=ScaleRequest.State.PENDING)))  # fmt: skip
