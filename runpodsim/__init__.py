"""A local RunPod: the GraphQL API that the runpod SDK speaks, plus a farm of virtual pods.

For tests, benchmarks and demos; never for production. One asyncio process
serves the API and every virtual pod's pod-server endpoints, so a hundred pods
cost one process. Start it with ``python manage.py runpodsim`` or, in tests,
``SimulatorThread(config).start()``; point the SDK at it with
``RUNPOD_API_BASE_URL`` and fleetadmin's pod URLs with ``RUNPOD_POD_URL_TEMPLATE``
(see ``Endpoint.environment()``).
"""

from __future__ import annotations

from runpodsim.config import SimConfig
from runpodsim.runner import Endpoint, SimulatorThread

__all__ = ["Endpoint", "SimConfig", "SimulatorThread"]
