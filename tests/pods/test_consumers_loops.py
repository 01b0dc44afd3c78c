"""The websocket tests' scenarios each run on a loop of their own: none meets a lock of an earlier one's loop."""

from __future__ import annotations

import asyncio

import pytest
from channels.layers import get_channel_layer

from tests.pods.test_consumers import run


def test_each_scenario_has_a_channel_layer_of_its_own(settings):
    async def layer():
        return get_channel_layer()

    assert run(layer) is not run(layer)


def test_a_lock_an_earlier_scenario_left_bound_to_its_loop_is_not_met_again(settings):
    """channels_redis's per-channel locks: a receive cancelled while it waited for one (a client
    that left, a loaded machine) leaves the lock behind, bound to that loop; the next loop that
    waits on it failed with 'bound to a different event loop' (tests/pods/test_consumers.py under load)."""
    if "channels_redis" not in settings.CHANNEL_LAYERS["default"]["BACKEND"]:
        pytest.skip("channels_redis's locks: the in-memory layer has none")
    key = "specific.test!"

    async def leave_a_waiter_cancelled():
        locks = get_channel_layer().receive_clean_locks
        await locks.acquire(key)
        waiter = asyncio.ensure_future(locks.acquire(key))
        await asyncio.sleep(0)
        waiter.cancel()
        await asyncio.gather(waiter, return_exceptions=True)
        locks.release(key)

    async def wait_for_the_lock():
        locks = get_channel_layer().receive_clean_locks
        await locks.acquire(key)
        waiter = asyncio.ensure_future(locks.acquire(key))
        await asyncio.sleep(0)
        locks.release(key)
        await asyncio.wait_for(waiter, 10)
        locks.release(key)

    run(leave_a_waiter_cancelled)
    run(wait_for_the_lock)
