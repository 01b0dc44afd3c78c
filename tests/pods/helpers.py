"""Shared set-ups for the pods tests."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

from django.db.models import Min, QuerySet
from django.utils import timezone

from pods.models import Pod, Pool, pod_name
from pods.services import boot, passes
from pods.services.passes import PassResult


def boot_until_settled(pod_id: int, *, timeout: float = 180.0, sleep: Callable[[float], None] = time.sleep) -> Pod:
    """Drive one boot's steps here, as passes would, until the pod leaves BOOTING; the pod.

    Test code only: it sleeps until each step is due (a pass never sleeps). ``timeout``
    guards against hangs; the boot's own stage limits are what end a boot that never serves.
    """
    deadline = time.monotonic() + timeout
    while True:
        pod = Pod.objects.select_related("pool").get(pk=pod_id)
        if pod.state != Pod.State.BOOTING:
            return pod
        assert time.monotonic() < deadline, f"{pod.name} still booting ({pod.boot_stage}) after {timeout} s"
        if pod.step_at is not None and (wait := (pod.step_at - timezone.now()).total_seconds()) > 0:
            sleep(wait)
        boot.boot_step(pod_id)


def passes_until_settled(pods: QuerySet, *, timeout: float = 180.0) -> list[PassResult]:
    """Run passes here, as the workers run them when the clock asks, until none of ``pods`` boots;
    what each pass did. Test code only: between passes it sleeps until the next step is due."""
    deadline = time.monotonic() + timeout
    results = []
    while (booting := pods.filter(state=Pod.State.BOOTING)).exists():
        assert time.monotonic() < deadline, (
            f"still booting after {timeout} s: {list(booting.values('name', 'boot_stage'))}"
        )
        due = booting.aggregate(first=Min("step_at"))["first"]
        if due is not None and (wait := (due - timezone.now()).total_seconds()) > 0:
            time.sleep(wait)
        result = passes.pass_run()
        assert result is not None, "another pass holds the lease"
        results.append(result)
    return results


def terminate_what_ended() -> int:
    """What the next pass does with the pods that ended here: terminate them at the provider. How many."""
    from pods.services import lifecycle

    pending = list(Pod.objects.filter(terminate_pending=True).values_list("pk", flat=True))
    for pod_id in pending:
        lifecycle.terminate_step(pod_id)
    return len(pending)


def new_pod(pool: Pool) -> Pod:
    """A pod row of the pool's, as the scaler stages a boot (boot_until_settled drives it)."""
    return Pod.objects.create(pool=pool, name=pod_name(pool, uuid.uuid4().hex[:8]), lanes=pool.lanes_per_pod)


def api_get(client, path: str, token: str | None = None):
    """GET ``path`` with the test client, carrying ``token`` when given."""
    headers = {"HTTP_AUTHORIZATION": f"Bearer {token}"} if token else {}
    return client.get(path, **headers)
