"""What pods registers at start-up (``PodsConfig.ready``): the rows its passes advance, the
work of the workers' clock and its part of ``/metrics`` (the platform, fleetadmin, imports no app).
"""

from __future__ import annotations

from fleetadmin.clusters import register_clock_work
from fleetadmin.metrics import register_source
from pods.metrics import fleet_metrics
from pods.models import Pod, Pool, ScaleRequest
from pods.services import autostop, boot, lifecycle, passes, scale_requests, scaler
from pods.services.passes import Work


def register() -> None:
    # A pod whose step time has come is due a boot step or a terminate step: one `waiting` for both.
    passes.register(
        Work("boot", boot.boots_due, boot.boot_step, waiting=lambda now: Pod.objects.filter(step_at__lte=now))
    )
    passes.register(Work("terminate", lifecycle.terminations_due, lifecycle.terminate_step))
    passes.register(Work("keepalive", autostop.keepalives_due, autostop.keepalive_step,
                         waiting=autostop.keepalives_waiting))  # fmt: skip
    passes.register(Work("shed tick", scaler.shed_ticks_due, scaler.shed_tick_step,
                         waiting=lambda now: Pool.objects.filter(shed_tick_at__lte=now)))  # fmt: skip
    passes.register(Work("scale request", scale_requests.scale_requests_due, scale_requests.scale_request_step,
                         waiting=lambda now: ScaleRequest.objects.filter(state=ScaleRequest.State.PENDING)))  # fmt: skip
    register_clock_work("passes", passes.pass_tick)
    register_source("pods", fleet_metrics)
