"""The pool a job takes when none is named: the cheapest open pool that meets the forecast
(pods.services.forecast.forecast_choice), decided from plain values."""

from __future__ import annotations

from pods.services.forecast import forecast_choice
from pods.templatetags.dashboard import about_minutes, dollars_words


def pool(key: str, **sizings: tuple[float, float | None]) -> dict:
    return {"pool": key, "sizings": {name: {"pods": 1, "minutes": m, "dollars": d} for name, (m, d) in sizings.items()}}


FORECAST = {
    "pools": [
        pool("gpu", fastest=(2.0, 0.40), balanced=(4.0, 0.20), cheapest=(9.0, 0.10)),
        pool("local", fastest=(30.0, 0.0), balanced=(30.0, 0.0), cheapest=(30.0, 0.0)),
    ]
}


def test_without_a_deadline_the_cheapest_pool_for_the_priority_is_chosen():
    assert forecast_choice(FORECAST, priority="balanced") == ("local", "balanced")
    assert forecast_choice(FORECAST, priority="fastest") == ("local", "fastest")


def test_with_a_deadline_the_cheapest_pool_and_sizing_that_meet_it_are_chosen():
    assert forecast_choice(FORECAST, priority="balanced", minutes_left=60) == ("local", "fastest")
    assert forecast_choice(FORECAST, priority="balanced", minutes_left=10) == ("gpu", "cheapest")
    assert forecast_choice(FORECAST, priority="balanced", minutes_left=5) == ("gpu", "balanced")


def test_when_no_pool_meets_the_deadline_the_quickest_is_chosen():
    assert forecast_choice(FORECAST, priority="balanced", minutes_left=1) == ("gpu", "fastest")


def test_a_pool_without_a_price_is_taken_only_when_no_price_is_known():
    unpriced = {"pools": [pool("dear", balanced=(1.0, None)), pool("gpu", balanced=(4.0, 0.2))]}
    assert forecast_choice(unpriced, priority="balanced") == ("gpu", "balanced")
    assert forecast_choice({"pools": [pool("dear", balanced=(1.0, None))]}, priority="balanced") == ("dear", "balanced")


def test_equal_costs_go_to_the_quicker_pool():
    even = {"pools": [pool("slow", balanced=(9.0, 0.0)), pool("quick", balanced=(3.0, 0.0))]}
    assert forecast_choice(even, priority="balanced") == ("quick", "balanced")


def test_durations_and_dollars_are_said_in_words():
    assert [about_minutes(m) for m in (0.2, 1.2, 2.21, 59.6, 80, 600)] == [
        "under a minute", "about 1 minute", "about 2 minutes", "about 1 hour", "about 1 hour 20 minutes",
        "about 10 hours",
    ]  # fmt: skip
    assert [dollars_words(d) for d in (None, 0, 0.0011, 0.42, 12.5, 1234.4)] == [
        "price unknown", "no charge", "under $0.01", "$0.42", "$12.50", "$1,234",
    ]  # fmt: skip
