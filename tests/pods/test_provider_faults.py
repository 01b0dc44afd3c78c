"""The RunPod API misbehaving during boots: 5xx, slow answers, no capacity anywhere, a revoked key.

Every test drives the real boot steps (``boot.boot_step``, until the pod settles) and the real tick
(``scaler.pool_tick``) through the unmodified SDK against the simulator,
with faults injected there. Each ends by checking that no pod runs at the
simulator that the database does not count as alive (after a reconcile that
finds nothing to clean up).
"""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.utils import timezone

from pods.models import Alert, BootAttempt, CapacityVerdict, Pod, Pool
from pods.services import lifecycle, reconcile, scaler
from tests.pods.conftest import EMPTY, GOOD
from tests.pods.helpers import boot_until_settled, new_pod, terminate_what_ended
from tests.pods.test_pod_services import _pages

CREATE = "podFindAndDeployOnDemand"


@pytest.fixture
def good_pool(db):
    """A pool with one candidate that has capacity: a fault, not the candidate walk, decides the boot."""
    return Pool.objects.create(
        key="gpu1",
        provider="runpod",
        max_pods=2,
        lanes_per_pod=2,
        config={
            "image": "ghcr.io/example/fleetadmin-pod:1",
            "candidates": [{"gpu_types": [GOOD], "cloud_type": "SECURE", "data_centers": ["EU-RO-1"]}],
        },
    )


def _tick_and_boot(pool: Pool) -> list[Pod]:
    """One scaler tick, then the boots it started, stepped here as passes would step them."""
    booted = scaler.pool_tick(pool=pool).booted
    return [boot_until_settled(pod_id) for pod_id in booted]


def assert_sim_and_rows_agree(sim, settings) -> None:
    """Every pod alive at the simulator is an alive row, and every alive row with a provider id
    is at the simulator; reconcile (run as the schedule would) has nothing to clean up."""
    settings.RECONCILE_GRACE_SECONDS = 0
    result = reconcile.reconcile(provider_name="runpod")
    assert (result.adopted, result.terminated, result.lost) == ([], [], []), result
    at_sim = {p["id"] for p in sim.pods() if p["desired_status"] != "TERMINATED"}
    alive = set(Pod.objects.alive().filter(pool__provider="runpod").exclude(provider_id="").values_list(
        "provider_id", flat=True))  # fmt: skip
    assert at_sim == alive


# --- 5xx -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("body", ["text", "json"])
def test_a_create_answered_with_5xx_is_retried_and_the_boot_succeeds(sim, good_pool, settings, body):
    sim.set_faults([{"kind": "http_error", "status": 502, "body": body, "count": 2, "operation": CREATE}])

    pod = boot_until_settled(new_pod(good_pool).pk)

    assert pod.state == Pod.State.READY, pod.error
    stats = sim.stats()
    assert stats["http_errors_injected"] == 2
    assert stats["create_calls"] == 3 and stats["pods_created"] == 1
    assert list(BootAttempt.objects.values_list("outcome", flat=True)) == [BootAttempt.Outcome.CREATED]
    assert_sim_and_rows_agree(sim, settings)


def test_a_create_whose_answer_was_lost_to_a_5xx_makes_one_pod_not_two(sim, good_pool, settings):
    # The create took effect at RunPod; only its answer was a 502. The retry must find that pod.
    sim.set_faults([{"kind": "http_error", "status": 502, "count": 1, "operation": CREATE, "after_execute": True}])

    pod = boot_until_settled(new_pod(good_pool).pk)

    assert pod.state == Pod.State.READY, pod.error
    assert sim.stats()["pods_created"] == 1
    assert [p["id"] for p in sim.pods()] == [pod.provider_id]
    assert_sim_and_rows_agree(sim, settings)


def test_5xx_while_waiting_for_the_pod_to_run_are_retried(sim, good_pool, settings):
    sim.set_faults([{"kind": "http_error", "status": 503, "count": 2, "operation": "pod"}])

    pod = boot_until_settled(new_pod(good_pool).pk)

    assert pod.state == Pod.State.READY, pod.error
    assert sim.stats()["http_errors_injected"] == 2
    assert_sim_and_rows_agree(sim, settings)


def test_5xx_that_outlast_a_boots_retries_fail_it_cleanly_and_the_next_tick_boots(sim, good_pool, settings):
    settings.SCALE_SECONDS_PER_PAGE_GUESS = 1.0
    _pages(good_pool, 2)
    sim.set_faults([{"kind": "http_error", "status": 500, "count": 3, "operation": CREATE}])

    [failed] = _tick_and_boot(good_pool)

    assert failed.state == Pod.State.FAILED
    assert "failed with errors" in failed.error and "no capacity" not in failed.error  # the reason, not a guess
    assert sim.stats()["pods_created"] == 0
    assert list(BootAttempt.objects.values_list("outcome", flat=True)) == [BootAttempt.Outcome.TRANSIENT]
    # A 5xx says nothing about capacity: the candidate is not blocked for the next boot.
    assert not CapacityVerdict.objects.filter(blocked_until__isnull=False).exists()

    [ready] = _tick_and_boot(good_pool)  # the next tick, with RunPod answering again

    assert ready.state == Pod.State.READY, ready.error
    assert sim.stats()["pods_created"] == 1
    assert_sim_and_rows_agree(sim, settings)


# --- slow answers --------------------------------------------------------------------------------


def test_slow_answers_within_the_limits_still_boot(sim, good_pool, settings):
    # Every GraphQL answer of the first ten comes 0.4 s late: catalogue, create, the pod polls.
    sim.set_faults([{"kind": "slow", "delay_s": 0.4, "count": 10}])
    started = time.monotonic()

    pod = boot_until_settled(new_pod(good_pool).pk)

    assert pod.state == Pod.State.READY, pod.error
    assert time.monotonic() - started >= 1.2  # the answers really were slow
    stats = sim.stats()
    assert stats["create_calls"] == 1 and stats["pods_created"] == 1
    assert_sim_and_rows_agree(sim, settings)


def test_a_slow_create_past_the_stage_limit_still_leaves_no_pod_running(sim, good_pool, settings):
    # The create is slow, the pod then takes longer to run than allowed: terminated, spend recorded.
    settings.POD_RUNNING_TIMEOUT_SECONDS = 1.0
    sim.set_faults([{"kind": "slow", "delay_s": 0.5, "count": 1, "operation": CREATE},
                    {"kind": "boot_stuck", "count": 1}])  # fmt: skip

    pod = boot_until_settled(new_pod(good_pool).pk)

    assert pod.state == Pod.State.FAILED and "not running" in pod.error
    assert pod.spend() > 0
    assert terminate_what_ended() == 1  # what the next pass does
    assert sim.stats()["pods_total"] == 0
    assert_sim_and_rows_agree(sim, settings)


# --- no capacity anywhere ------------------------------------------------------------------------


def test_no_capacity_anywhere_fails_the_boot_cleanly_and_every_booter_skips_the_candidates(sim, pool, settings):
    settings.SCALE_SECONDS_PER_PAGE_GUESS = 1.0
    _pages(pool, 2)
    sim.set_faults([{"kind": "no_capacity"}])
    before = timezone.now()

    [first] = _tick_and_boot(pool)

    assert first.state == Pod.State.FAILED and "no capacity" in first.error
    candidates = {f"runpod|{gpu}|SECURE|{dc}" for gpu in (EMPTY, GOOD) for dc in ("EU-RO-1", "US-KS-2")}
    attempts = list(BootAttempt.objects.filter(pod=first).values_list("candidate", "outcome"))
    assert sorted(attempts) == sorted((key, BootAttempt.Outcome.NO_CAPACITY) for key in candidates)
    verdicts = CapacityVerdict.objects.filter(key__in=candidates, blocked_until__isnull=False)
    assert {v.key for v in verdicts} == candidates  # written for every booter to see
    assert "no longer any instances" in verdicts.first().reason
    ttl = timedelta(seconds=settings.CAPACITY_VERDICT_TTL_SECONDS)
    assert all(before + ttl <= v.blocked_until <= timezone.now() + ttl for v in verdicts)  # they last the TTL
    assert sim.stats()["pods_total"] == 0

    creates = sim.stats()["create_calls"]
    [second] = _tick_and_boot(pool)  # the next tick: the verdicts hold, nothing is asked of RunPod

    assert second.state == Pod.State.FAILED
    assert sim.stats()["create_calls"] == creates
    assert_sim_and_rows_agree(sim, settings)

    # Capacity comes back; once the verdicts expire, the next tick boots without a person.
    # Their end is moved into the past rather than waited for: the test does not race the TTL.
    sim.set_faults([])
    CapacityVerdict.objects.filter(key__in=candidates).update(blocked_until=timezone.now() - timedelta(seconds=1))
    [third] = _tick_and_boot(pool)

    assert third.state == Pod.State.READY, third.error
    assert_sim_and_rows_agree(sim, settings)


# --- a refused key -------------------------------------------------------------------------------


def test_a_revoked_key_raises_an_alert_and_stops_boots_until_it_works_again(sim, good_pool, settings):
    settings.SCALE_SECONDS_PER_PAGE_GUESS = 1.0
    good_pool.max_pods = 1
    good_pool.save()
    ready = boot_until_settled(new_pod(good_pool).pk)  # the catalogue is cached by now
    assert ready.state == Pod.State.READY
    lifecycle.pod_release_now(pod=ready, reason="test")  # terminated here, as a pass would
    _pages(good_pool, 2)
    sim.set_faults([{"kind": "bad_key"}])  # RunPod answers 401 to everything, as after a revocation
    creates = sim.stats()["create_calls"]

    [refused] = _tick_and_boot(good_pool)

    assert refused.state == Pod.State.FAILED and "refused" in refused.error
    alert = Alert.objects.get(kind=Alert.Kind.AUTH, resolved_at__isnull=True)
    assert alert.pool == good_pool
    for _ in range(3):  # ticks while the key is refused rent nothing and ask RunPod for nothing
        assert _tick_and_boot(good_pool) == []
    assert sim.stats()["create_calls"] == creates + 1  # the one refused: the create itself, none since
    assert Pod.objects.filter(pool=good_pool).count() == 2

    # The key works again. The block lasts AUTH_RETRY_SECONDS from the last refusal: the alert is
    # aged instead of waited for, first to half of that (still blocked), then past it (a tick tries once more).
    sim.set_faults([])
    refusals = Alert.objects.filter(kind=Alert.Kind.AUTH, resolved_at__isnull=True)
    refusals.update(updated_at=timezone.now() - timedelta(seconds=settings.AUTH_RETRY_SECONDS / 2))
    assert _tick_and_boot(good_pool) == []
    refusals.update(updated_at=timezone.now() - timedelta(seconds=settings.AUTH_RETRY_SECONDS + 1))
    [booted] = _tick_and_boot(good_pool)

    assert booted.state == Pod.State.READY, booted.error
    assert not Alert.objects.filter(kind=Alert.Kind.AUTH, resolved_at__isnull=True).exists()
    assert_sim_and_rows_agree(sim, settings)


def test_a_key_refused_before_any_catalogue_fails_the_boot_with_an_alert_and_no_create(sim, good_pool, settings):
    settings.SCALE_SECONDS_PER_PAGE_GUESS = 1.0
    _pages(good_pool, 2)
    sim.set_faults([{"kind": "bad_key"}])

    [refused] = _tick_and_boot(good_pool)

    assert refused.state == Pod.State.FAILED
    assert Alert.objects.filter(kind=Alert.Kind.AUTH, resolved_at__isnull=True, pool=good_pool).exists()
    assert _tick_and_boot(good_pool) == []
    assert sim.stats()["create_calls"] == 0
    sim.set_faults([])
    assert_sim_and_rows_agree(sim, settings)
