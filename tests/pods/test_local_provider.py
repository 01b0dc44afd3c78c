"""The local provider starts real pod servers as subprocesses and finds them again."""

from __future__ import annotations

import os
import signal
import uuid

import pytest

from pods.providers.base import PodSpec
from pods.providers.local import LOCAL_OFFER, LocalProvider
from pods.services.boot import pod_is_serving
from tools.processes import wait_for


@pytest.fixture
def provider(settings, tmp_path):
    settings.VAR_DIR = tmp_path
    settings.DEPLOYMENT_PREFIX = f"t{uuid.uuid4().hex[:6]}"
    provider = LocalProvider()
    yield provider
    for pod in provider.list(prefix=settings.DEPLOYMENT_PREFIX):
        provider.terminate(pod.provider_id)


def _spec(settings, suffix="a", lanes=1):
    return PodSpec(name=f"{settings.DEPLOYMENT_PREFIX}-local-{suffix}", lanes=lanes, offer=LOCAL_OFFER)


def test_a_created_pod_serves_and_is_listed_by_its_prefix(provider, settings):
    created = provider.create(_spec(settings, lanes=2))
    seen = wait_for(lambda: provider.get(created.provider_id), 30, "the pod never appeared")
    assert seen.running and seen.base_url.startswith("http://127.0.0.1:")
    wait_for(lambda: pod_is_serving(seen.base_url), 30, "the pod never became ready")
    listed = provider.list(prefix=settings.DEPLOYMENT_PREFIX)
    assert [p.provider_id for p in listed] == [created.provider_id]
    assert provider.list(prefix="some-other-deployment") == []


def test_terminate_stops_the_process_and_is_idempotent(provider, settings):
    created = provider.create(_spec(settings))
    wait_for(lambda: provider.get(created.provider_id), 30, "the pod never appeared")
    provider.terminate(created.provider_id)
    assert provider.get(created.provider_id) is None
    provider.terminate(created.provider_id)  # already gone: no error
    assert provider.list(prefix=settings.DEPLOYMENT_PREFIX) == []


def test_a_pod_that_died_is_no_longer_found(provider, settings):
    created = provider.create(_spec(settings))
    wait_for(lambda: provider.get(created.provider_id), 30, "the pod never appeared")
    os.kill(int(created.provider_id), signal.SIGKILL)

    def gone():
        try:
            os.waitpid(int(created.provider_id), os.WNOHANG)  # our child: reap it
        except ChildProcessError:
            pass
        return provider.get(created.provider_id) is None

    wait_for(gone, 10, "a killed pod is still reported")


def test_get_refuses_an_id_that_is_not_a_pod(provider):
    assert provider.get("not-a-pid") is None
    assert provider.get(str(os.getpid())) is None  # a live process, but not a pod server
