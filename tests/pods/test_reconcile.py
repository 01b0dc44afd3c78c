"""Reconcile keeps to this deployment's pods: two deployments on one RunPod key (two databases, each
with the prefix it was given) leave each other's pods alone, which the old shared default "fa" did
not; and the pods a database has stay its own whatever their prefix."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid

import pytest

from pods.models import Pod, Pool, pod_name
from pods.providers.base import Offer, PodSpec
from pods.providers.runpod import RunPodProvider
from pods.services import reconcile
from tests.pods.conftest import GOOD, KEY
from tests.pods.helpers import boot_until_settled
from tools.processes import REPO, child_env

# The other deployment: a database of its own, migrated here, on the same simulated RunPod key. It
# reconciles, then creates a pod of its own (after: it has no row for it, so it would end it).
THEIRS = """
import json, sys
import django
django.setup()
from django.core.management import call_command
call_command("migrate", verbosity=0)
from fleetadmin.deployment import pod_prefix
from pods.providers.base import Offer, PodSpec
from pods.providers.runpod import RunPodProvider
from pods.services.reconcile import reconcile
result = reconcile(provider_name="runpod")
offer = Offer(sys.argv[1], "SECURE", "EU-RO-1")
theirs = RunPodProvider().create(PodSpec(name=f"{pod_prefix()}-gpu-theirs", lanes=1, offer=offer, image="img:1"))
print(json.dumps({"prefix": pod_prefix(), "terminated": result.terminated, "pod": theirs.name}))
"""


def _running() -> set[str]:
    return {pod.name for pod in RunPodProvider().list(prefix="")}


def _ours(pool: Pool) -> Pod:
    pod = boot_until_settled(Pod.objects.create(pool=pool, name=pod_name(pool, uuid.uuid4().hex[:8]), lanes=1).pk)
    assert pod.state == Pod.State.READY, pod.error
    return pod


def _the_other_deployment(sim, tmp_path, fleetadmin_deployment: str) -> dict:
    env = child_env(tmp_path, SQLITE_PATH=str(tmp_path / "theirs.sqlite3"), FLEETADMIN_DEPLOYMENT=fleetadmin_deployment,
                    RUNPOD_API_BASE_URL=sim.url, RUNPOD_API_KEY=KEY, RUNPOD_POD_URL_TEMPLATE=sim.pod_url_template,
                    RECONCILE_GRACE_SECONDS="0", DJANGO_SETTINGS_MODULE="fleetadmin.settings")  # fmt: skip
    for name in ("DATABASE_URL", "REDIS_URL"):  # an embedded deployment: nothing of this one's
        env.pop(name, None)
    done = subprocess.run([sys.executable, "-c", THEIRS, GOOD], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(
    "prefix, ends_the_other",
    [
        pytest.param("", False, id="each its own prefix, from its database"),
        pytest.param("fa", True, id="both the old shared default"),  # what the first case stops
    ],
)
def test_two_deployments_on_one_runpod_key_leave_each_others_pods_alone(
    sim, pool, settings, tmp_path, prefix, ends_the_other
):
    settings.DEPLOYMENT_PREFIX = prefix  # FLEETADMIN_DEPLOYMENT, here and there
    settings.RECONCILE_GRACE_SECONDS = 0
    ours = _ours(pool)

    theirs = _the_other_deployment(sim, tmp_path, prefix)
    assert (theirs["terminated"] == [ours.name]) is ends_the_other
    assert (ours.name in _running()) is not ends_the_other

    result = reconcile.reconcile(provider_name="runpod")
    assert (result.terminated == [theirs["pod"]]) is ends_the_other
    assert (theirs["pod"] in _running()) is not ends_the_other
    if not ends_the_other:
        assert ours.name.split("-")[0] != theirs["prefix"]


def test_the_pods_a_database_has_stay_its_own_when_its_prefix_changes(sim, pool, settings):
    settings.RECONCILE_GRACE_SECONDS = 0
    settings.DEPLOYMENT_PREFIX = "fa"  # before the upgrade (or the renewal)
    ours = _ours(pool)
    strangers = RunPodProvider().create(PodSpec(name="fa-gpu-stranger", lanes=1, offer=Offer(GOOD, "SECURE", "EU-RO-1"),
                                                image="img:1"))  # fmt: skip

    settings.DEPLOYMENT_PREFIX = ""  # the database's own, now
    result = reconcile.reconcile(provider_name="runpod")

    assert (result.adopted, result.terminated, result.lost) == ([], [], [])
    assert Pod.objects.get(pk=ours.pk).state == Pod.State.READY
    assert {ours.name, strangers.name} <= _running()  # another "fa" deployment's pod: not ours to end
    assert not pod_name(pool, "x").startswith("fa-")
