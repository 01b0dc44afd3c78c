"""The pod server stops itself when the control plane has not spoken to it for its autostop
interval (issue 39, invariant 21): a real ``python -m podserver`` process."""

from __future__ import annotations

import subprocess
import time

import httpx
import pytest

from podserver.config import load

from .conftest import HANG_GUARD, Pod

pytestmark = pytest.mark.once_sqlite

TOKEN = "autostop-test-token"
AUTOSTOP = 3.0


def _exit_code(pod: Pod) -> int:
    try:
        return pod.proc.wait(timeout=HANG_GUARD)
    except subprocess.TimeoutExpired:
        pod.stop()
        pytest.fail("the pod server did not stop itself")


def test_it_exits_once_nobody_with_the_token_asks_for_its_interval() -> None:
    pod = Pod("--autostop", str(AUTOSTOP), env={"POD_TOKEN": TOKEN}, stderr=subprocess.PIPE)
    try:
        # Asked with the token for three intervals: it stays up.
        until = time.monotonic() + 3 * AUTOSTOP
        while time.monotonic() < until:
            assert pod.proc.poll() is None, "it stopped while the control plane was speaking to it"
            httpx.get(f"{pod.url}/healthz", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=HANG_GUARD)
            time.sleep(0.2)
        # Then only strangers probe /healthz (no token): that does not keep it billing.
        while pod.proc.poll() is None:
            try:
                httpx.get(f"{pod.url}/healthz", timeout=2)
            except httpx.HTTPError:
                break
            time.sleep(0.2)
        assert _exit_code(pod) == 0
        assert "autostop" in pod.proc.stderr.read()
    finally:
        pod.stop()


def test_requests_with_a_wrong_token_do_not_keep_it_up() -> None:
    pod = Pod("--autostop", str(AUTOSTOP), env={"POD_TOKEN": TOKEN}, stderr=subprocess.DEVNULL)
    try:
        while pod.proc.poll() is None:
            try:
                httpx.get(f"{pod.url}/v1/models", headers={"Authorization": "Bearer wrong"}, timeout=2)
            except httpx.HTTPError:
                break
            time.sleep(0.2)
        assert _exit_code(pod) == 0
    finally:
        pod.stop()


def test_the_interval_comes_from_the_environment_or_a_flag() -> None:
    assert load([], environ={"AUTOSTOP_SECONDS": "600"}).autostop == 600.0
    assert load(["--autostop", "45"], environ={"AUTOSTOP_SECONDS": "600"}).autostop == 45.0
    assert load([], environ={}).autostop == 0.0  # run by hand: never


@pytest.mark.parametrize("raw", ["-5", "soon"])
def test_it_refuses_a_bad_interval(raw: str) -> None:
    with pytest.raises(SystemExit):
        load([], environ={"AUTOSTOP_SECONDS": raw})
