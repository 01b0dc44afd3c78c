"""bench/_cpu.py: the CPU ceilings CI asserts widen on a machine slower than the one they were
checked on, in proportion to how long it takes for a fixed piece of Python, and never narrow."""

from __future__ import annotations

import pytest

from bench import _cpu


def test_the_machines_python_speed_is_measured_once_a_process():
    first = _cpu.python_seconds()

    assert first > 0
    assert _cpu.python_seconds() == first  # (the best of three, kept: every benchmark's figures agree)


@pytest.mark.parametrize(
    ("seconds", "scale", "ceiling"),
    [
        (_cpu.REFERENCE_PYTHON_SECONDS / 2, 1.0, 16.0),  # a faster machine: the ceiling as written
        (_cpu.REFERENCE_PYTHON_SECONDS, 1.0, 16.0),
        (_cpu.REFERENCE_PYTHON_SECONDS * 2.5, 2.5, 40.0),  # 2.5 times slower: 2.5 times the room
    ],
)
def test_a_ceiling_widens_with_the_machines_slowness_and_never_narrows(monkeypatch, seconds, scale, ceiling):
    monkeypatch.setattr(_cpu, "python_seconds", lambda: seconds)

    figures = _cpu.per_unit("page", cpu_s=0.03, units=1, ceiling_ms=16.0)

    assert figures["control_plane_cpu_ceiling_scale"] == scale
    assert figures["control_plane_cpu_ceiling_ms_per_page"] == ceiling
    assert _cpu.within_ceiling(figures) == (30.0 <= ceiling)
