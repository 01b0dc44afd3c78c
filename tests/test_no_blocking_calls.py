"""Invariant 2: no call that blocks the thread inside any ``async def`` of the project.

Two checks share it: ruff's ASYNC rules (pyproject.toml, run by tests/test_lint.py) for sleep,
files, processes and HTTP clients, and tools/blocking_check.py for the rest (the ORM, the cache,
django-q2, runpod, joins, locks, sockets, and calls through the module's own functions).

The allowlist is empty and stays empty: a finding is fixed in the code (hand the
call to a thread: ``asyncio.to_thread``, the loop's own executor, ``sync_to_async``),
never excused here.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from tools.blocking_check import check_project, project_files

ROOT = Path(__file__).resolve().parent.parent


def test_the_walk_covers_the_project_and_skips_what_is_not_ours():
    files = {path.relative_to(ROOT).as_posix() for path in project_files(ROOT)}
    assert {"ocrjobs/dispatch/loop.py", "pods/api.py", "fleetadmin/api.py", "tests/test_no_blocking_calls.py"} <= files
    # Not the product, walked all the same: a tool or a benchmark may run an event loop too.
    assert {"tools/loadprobe.py", "tools/blocking_check.py", "bench/control_plane.py"} <= files
    assert not [f for f in files if f.startswith(".venv/") or "/migrations/" in f or "__pycache__" in f]


def test_no_async_def_in_the_project_makes_a_blocking_call():
    findings = check_project(ROOT)
    assert not findings, "blocking calls inside async def (invariant 2):\n" + "\n".join(str(f) for f in findings)


# One call a line; the code ruff's ASYNC rules give each, with the project's configuration.
LEFT_TO_RUFF = {
    "time.sleep(1)": "ASYNC251",
    "open(name)": "ASYNC230",
    "Path(name).read_text()": "ASYNC240",
    "os.path.exists(name)": "ASYNC240",
    "input()": "ASYNC250",
    "subprocess.run(['true'])": "ASYNC221",
    "os.system('true')": "ASYNC221",
    "subprocess.Popen(['true'])": "ASYNC220",
    "os.waitpid(1, 0)": "ASYNC222",
    "requests.get(url)": "ASYNC210",
    "httpx.post(url)": "ASYNC210",
    "urllib.request.urlopen(url)": "ASYNC210",
    "client.get(url)": "ASYNC212",
}


def test_ruff_reports_what_the_check_leaves_to_it(tmp_path: Path):
    header = textwrap.dedent("""\
        import os
        import subprocess
        import time
        import urllib.request
        from pathlib import Path

        import httpx
        import requests


        async def f(name, url, client: httpx.Client):
        """)
    source = header + "".join(f"    {call}\n" for call in LEFT_TO_RUFF)
    module = tmp_path / "blocks.py"
    module.write_text(source)
    done = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--config", str(ROOT / "pyproject.toml"), "--no-cache",
         "--output-format", "json", str(module)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    first = header.count("\n") + 1
    found = {
        item["location"]["row"]: item["code"]
        for item in json.loads(done.stdout)
        if item["code"] and item["code"].startswith("ASYNC")
    }
    assert found == {first + i: code for i, code in enumerate(LEFT_TO_RUFF.values())}, done.stderr
    # and the check itself does not report them twice
    assert check_project(tmp_path) == []
