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

    probe = cpuinfo.get_cpu_info
    cpuinfo.get_cpu_info = lambda: {"brand_raw": platform.processor() or "unknown"}
    try:
        import runpod  # noqa: F401
    finally:
        cpuinfo.get_cpu_info = probe


_import_runpod()
