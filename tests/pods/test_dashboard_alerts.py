"""Alerts that alarm only on trouble (issue 42, item 9): a boot that found its first GPU type
full and went on to the next is information, not a red boot failure; a boot's time is the time
to ready, not the create call's "0.0 s"."""

from __future__ import annotations

import re
from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from pods import dashboard, sections
from pods.models import BootAttempt, Pod, Pool
from pods.selectors import fleet_status_snapshot


def staff_push() -> dict[str, str]:
    fleet_status_snapshot.clear()
    sections.forget()
    return dashboard.render_payloads(staff=True, user_ids=[])[dashboard.STAFF]


@pytest.mark.django_db
def test_a_fallback_is_information_and_a_boot_shows_its_time_to_ready():
    now = timezone.now()
    pool = Pool.objects.create(key="gpu", provider="runpod", max_pods=4, lanes_per_pod=2)
    pod = Pod.objects.create(pool=pool, name="fa-gpu-1", state=Pod.State.READY, lanes=2, gpu_type="RTX 4090",
                             cost_per_hr=Decimal("0.69"), billed_from=now - timedelta(seconds=10),
                             ready_at=now - timedelta(seconds=2))  # fmt: skip
    full = BootAttempt.objects.create(pod=pod, candidate="runpod|RTX A5000|SECURE|*", outcome="no_capacity",
                                      error="no instances available", seconds=0.02,
                                      created_at=now - timedelta(seconds=10.5))  # fmt: skip
    BootAttempt.objects.create(pod=pod, candidate="runpod|RTX 4090|SECURE|*", outcome="created", seconds=0.03,
                               created_at=now - timedelta(seconds=10))  # fmt: skip

    push = staff_push()

    alerts, boots = push["alerts"], push["boots"]
    assert 'class="boot-failure"' not in alerts
    assert re.search(r'<span class="count">0</span>', alerts)  # no red badge for normal work
    fallback = re.search(r'<li class="fallback">.*?</li>', alerts, re.S).group(0)
    assert "info" in fallback and full.candidate in fallback and "no capacity" in fallback
    assert "8.0 s" in boots  # from the create to the pod joining
    assert "Took" not in boots


@pytest.mark.django_db
def test_a_boot_that_failed_stays_a_red_failure():
    now = timezone.now()
    pool = Pool.objects.create(key="gpu", provider="runpod", max_pods=4, lanes_per_pod=2)
    pod = Pod.objects.create(pool=pool, name="fa-gpu-2", state=Pod.State.FAILED, lanes=2, ended_at=now,
                             error="every candidate full")  # fmt: skip
    BootAttempt.objects.create(pod=pod, candidate="runpod|RTX A5000|SECURE|*", outcome="no_capacity",
                               error="no instances available", seconds=0.02)  # fmt: skip

    alerts = staff_push()["alerts"]

    assert 'class="boot-failure"' in alerts and 'class="failed-pod"' in alerts
    assert '<span class="count bad">2</span>' in alerts and 'class="fallback"' not in alerts
