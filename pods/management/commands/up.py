"""Start everything on this machine: the front, the workers, and (on demand) local pods.

Ctrl-C (or SIGTERM) stops every process it started, local pods included, and lists the paid
pods still up: they stop themselves once nobody has spoken to them for their pool's autostop
interval (pods/services/autostop.py), or are used again when fleetadmin starts again.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand

from fleetadmin.workers import ended_with
from pods.enqueue import nudge_scaler
from pods.models import Pool
from pods.services.autostop import paid_pods_up
from pods.services.lifecycle import local_pods_release


class Command(BaseCommand):
    help = "Run the front (daphne) and the workers (qcluster) until interrupted."

    def add_arguments(self, parser):
        parser.add_argument("--port", type=int, default=int(os.environ.get("PORT", "8000")))
        parser.add_argument("--host", default=os.environ.get("HOST", "127.0.0.1"))

    def handle(self, *args, port: int, host: str, **options):
        call_command("migrate", interactive=False, verbosity=0)
        call_command("bootstrap")
        # One local pod kept ready while this runs: a first job's pages wait for no boot (~1 s of
        # its ~13 s in bench/local.py); the workers' scaler keeps it (LOCAL_WARM_PODS, settings).
        env = {**os.environ, "LOCAL_WARM_PODS": os.environ.get("LOCAL_WARM_PODS", "1")}
        # Both end with this process, also when it is killed with -9 (they get SIGTERM).
        children = {
            "front": subprocess.Popen(
                [sys.executable, "-m", "fleetadmin.front", "-b", host, "-p", str(port), "fleetadmin.asgi:application"],
                env=env,
                preexec_fn=ended_with(os.getpid()),
            ),
            # The supervisor: it starts the django-q2 cluster afresh when a worker is killed, and ends
            # every process of the cluster when it stops.
            "workers": subprocess.Popen(
                [sys.executable, "manage.py", "workers"],
                cwd=settings.BASE_DIR,
                env=env,
                preexec_fn=ended_with(os.getpid()),
            ),
        }
        stopping = False

        def stop(signum, frame):
            nonlocal stopping
            stopping = True

        signal.signal(signal.SIGINT, stop)
        signal.signal(signal.SIGTERM, stop)
        for pool in Pool.objects.all():
            nudge_scaler(pool.pk)  # pages left from a previous run start again now
        self.stdout.write(self.style.SUCCESS(f"fleetadmin is running at http://{host}:{port}/  (Ctrl-C stops it)"))
        try:
            while not stopping:
                for name, child in children.items():
                    if child.poll() is not None:
                        self.stderr.write(f"the {name} exited with code {child.returncode}; stopping")
                        stopping = True
                time.sleep(0.5)
        finally:
            self.stdout.write("stopping…")
            for child in children.values():
                if child.poll() is None:
                    child.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + 30  # the workers' grace (10 s) and their kill fit in it
            for child in children.values():
                try:
                    child.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    child.kill()
                    child.wait()
            local_pods_release(reason="fleetadmin stopped")  # the workers are stopped: no pass will come
            self.report_paid_pods()
        self.stdout.write("stopped.")

    def report_paid_pods(self) -> None:
        """Say which paid pods are still up (and billing) now that nothing here speaks to them."""
        up = paid_pods_up()
        if not up:
            self.stdout.write("no paid pods are up.")
            return
        self.stderr.write(self.style.WARNING(f"{len(up)} paid pod(s) still up, billing until they stop themselves:"))
        for pod, stops_by in up:
            state = "ended, terminate not confirmed" if not pod.is_alive else pod.state
            self.stderr.write(
                f"  {pod.name}  pool {pod.pool.key}  {pod.gpu_type or '?'}  ${pod.cost_per_hr}/h  {state}"
                f"  stops itself by {stops_by:%Y-%m-%d %H:%M:%S} UTC"
            )
        self.stderr.write("Start fleetadmin again to use or release them sooner (its passes terminate ended pods).")
