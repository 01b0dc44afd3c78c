"""pods/providers/sdk.py: the runpod SDK is imported without py-cpuinfo's probe (a second Python
interpreter that takes ~1.2 CPU-seconds), and the probe is left as it was for anyone else."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# In a fresh interpreter (the SDK not imported yet): every process started during the import, what
# runpod's debugger took for the CPU's name, and whether cpuinfo's own probe is back in place.
IMPORT = """
import json, platform, subprocess
started = []
popen = subprocess.Popen
class Recorded(popen):
    def __init__(self, args, *rest, **options):
        started.append(repr(args))
        super().__init__(args, *rest, **options)
subprocess.Popen = Recorded
import cpuinfo
probe = cpuinfo.get_cpu_info
import pods.providers.sdk
from runpod.serverless.utils import rp_debugger
print(json.dumps({"started": started, "processor": rp_debugger.PROCESSOR,
                  "platform": platform.processor() or "unknown", "probe_back": cpuinfo.get_cpu_info is probe}))
"""


def test_the_sdk_is_imported_with_the_platforms_cpu_name_and_no_probe_and_the_probe_is_put_back():
    done = subprocess.run([sys.executable, "-c", IMPORT], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    shown = json.loads(done.stdout.strip().splitlines()[-1])
    # The hook took effect: runpod read our answer, not py-cpuinfo's (which starts an interpreter).
    assert shown["processor"] == shown["platform"]
    assert not [args for args in shown["started"] if "cpuinfo" in args], "py-cpuinfo's probe ran"
    assert shown["probe_back"]
