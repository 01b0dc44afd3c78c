"""What the install promises: libraries whose internals the code touches cannot move under it."""

from __future__ import annotations

import subprocess

from packaging.requirements import Requirement
from packaging.version import Version

from tools.processes import REPO

# Each reaches into these libraries' internals (fleetadmin/front.py: daphne and Twisted;
# fleetadmin/workers.py: django-q2; ocrjobs/dispatch/documents.py: aiohttp's Payload;
# ocrjobs/services/searchable_pdf.py: reportlab's TTF character map).
TOUCHED_INTERNALS = {"daphne", "twisted", "django-q2", "aiohttp", "reportlab"}


def _requirements() -> dict[str, Requirement]:
    lines = (REPO / "requirements.txt").read_text().splitlines()
    found = [Requirement(line.split("#")[0]) for line in lines if line.split("#")[0].strip()]
    return {req.name.lower(): req for req in found}


def test_every_library_whose_internals_the_code_touches_has_an_upper_bound():
    requirements = _requirements()
    for name in TOUCHED_INTERNALS:
        specifier = requirements[name].specifier
        assert any(spec.operator in ("<", "<=", "==", "~=") for spec in specifier), f"{name}: {specifier}"
        assert not specifier.contains(Version("999")), f"{name} admits any future release: {specifier}"


def test_the_install_stops_when_pip_fails(tmp_path):
    # bin/install's pip step, run against a requirement that cannot be found: a non-zero exit,
    # and pip's own words shown (it once ended with `|| true`, so CI went on without them).
    script = (REPO / "bin" / "install").read_text()
    start = script.index("pip_install() {")
    function = script[start : script.index("\n}\n", start) + 3]
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    (tmp_path / ".venv" / "bin" / "python").symlink_to(REPO / ".venv" / "bin" / "python")
    done = subprocess.run(
        ["bash", "-c", f"set -euo pipefail\n{function}\npip_install --no-index fleetadmin-no-such-package==1"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0
    assert "fleetadmin-no-such-package" in done.stdout + done.stderr
