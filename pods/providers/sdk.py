"""The runpod SDK, imported without its CPU probe (pods/providers/runpod.py imports this first).

``import runpod`` asks py-cpuinfo for the CPU's name (for its serverless debugger, which the
control plane never runs), and py-cpuinfo starts a second Python interpreter to find it: 1.2 s
of CPU in a child and 1.2 of the import's 1.6 s of wall clock, in every process that imports
the SDK (the front, each qcluster). Here the probe answers the platform's own name instead,
for the length of the import only.
"""

from __future__ import annotations

import platform
import sys


def _import_runpod() -> None:
    if "runpod" in sys.modules:
        return
    import cpuinfo

    # No public hook serves: runpod/serverless/utils/rp_debugger.py calls cpuinfo.get_cpu_info()
    # at import (module level) and neither library offers a switch. Restored once the import is
    # done; tests/pods/test_sdk.py fails if it stops taking effect (the import would probe again).
    probe = cpuinfo.get_cpu_info
    cpuinfo.get_cpu_info = lambda: {"brand_raw": platform.processor() or "unknown"}
    try:
        import runpod  # noqa: F401
    finally:
        cpuinfo.get_cpu_info = probe


_import_runpod()
