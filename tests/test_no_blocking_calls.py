"""Invariant 2: no call that blocks the thread inside any ``async def`` of the project.

The allowlist is empty and stays empty: a finding is fixed in the code (hand the
call to a thread: ``asyncio.to_thread``, the loop's own executor, ``sync_to_async``),
never excused here.
"""

from __future__ import annotations

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
