"""Run the local RunPod simulator until interrupted.

    python manage.py runpodsim --port 8765 [--config sim.json] [--gateway] [--realistic [--seed N]]

Prints ``RUNPODSIM http://HOST:PORT`` once it listens, then the environment
that points fleetadmin (and the runpod SDK) at it: pods under hosts of their own
(``http://{pod_id}-{port}.proxy.localhost:PORT``), or with ``--gateway`` every
pod under ``http://HOST:PORT/pods/{pod_id}``. ``--realistic`` turns on every behaviour of real
RunPod the simulator models at plausible rates (``SimConfig.realistic``): 429s, gateway pages,
capacity in every wording, null creates, runtime reading null, listing lag, terminate writing
EXITED, outbids on both paths, pods stopped by RunPod.
"""

from __future__ import annotations

import asyncio

from django.core.management.base import BaseCommand, CommandError, CommandParser
from pydantic import ValidationError

from fleetadmin.collector import quiet_collector
from runpodsim import Endpoint, SimConfig
from runpodsim.runner import serve


class Command(BaseCommand):
    help = "Run a local RunPod-compatible API and its virtual pods (tests, benchmarks, demos)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--config", help="JSON file: catalogue, capacity, timings, faults")
        parser.add_argument("--gateway", action="store_true", help="announce every pod under /pods/{pod_id}")
        parser.add_argument("--realistic", action="store_true", help="as hard as RunPod: every fault mode at its rate")
        parser.add_argument("--seed", type=int, default=None, help="with --realistic: the faults' random draws repeat")

    def handle(self, *args: object, **options: object) -> None:
        try:
            config = SimConfig.load(str(options["config"])) if options["config"] else SimConfig()
        except (OSError, ValidationError) as exc:
            raise CommandError(f"cannot load simulator config: {exc}") from exc
        if options["gateway"]:
            config = config.model_copy(update={"gateway": True})
        if options["realistic"]:
            config = config.realistic(seed=options["seed"])
        try:
            # One process stands in for every pod: its full collections paused them all at once
            # (up to 102 ms at 256 pods x 8 lanes), which no fleet of machines does.
            with quiet_collector():
                asyncio.run(serve(config, str(options["host"]), int(options["port"]), announce=self._announce))
        except OSError as exc:
            raise CommandError(f"cannot listen: {exc}") from exc

    def _announce(self, endpoint: Endpoint) -> None:
        self.stdout.write(f"RUNPODSIM {endpoint.url}")
        for name, value in endpoint.environment().items():
            self.stdout.write(f"export {name}='{value}'")
        self.stdout.flush()
