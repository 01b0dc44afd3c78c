"""The code reads one way: ruff's checks and its format (pyproject.toml), as `make lint` runs them."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tools.processes import REPO


@pytest.mark.parametrize("command", [["check", "."], ["format", "--check", "."]], ids=["check", "format"])
def test_ruff_finds_nothing(command):
    done = subprocess.run([sys.executable, "-m", "ruff", *command], cwd=REPO, capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
