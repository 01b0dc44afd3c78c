"""RunPod's answers sorted into the provider errors: every code and wording in the table, 429s,
Retry-After, HTML pages, and a null create (pods/providers/runpod_api.py). Plain values, no server."""

from __future__ import annotations

import email.utils

import pytest

from pods.providers import runpod_api
from pods.providers.base import AuthFailed, BadRequest, Balance, NoCapacity, Transient, UnknownOffer
from pods.providers.runpod_api import Answer, PodGone, UnknownOperation, check_answer, classify_error, retry_after
from runpodsim.config import (
    BID_REFUSED_MESSAGE,
    CAPACITY_WORDINGS,
    INSUFFICIENT_BALANCE_MESSAGE,
    SOMETHING_WENT_WRONG_MESSAGE,
    SPENDING_LIMIT_MESSAGE,
)

# What RunPod was seen to send (review runpod-fidelity-8630753 and the SDK reference), each with
# the error it must be sorted into.
SEEN = [
    (
        "There are no longer any instances available with the requested specifications. Please refresh and try again.",
        None,
        NoCapacity,
    ),
    ("There are no instances available with the request specifications. Please try again later.", None, NoCapacity),
    ("There are no instances available with the requested specifications.", None, NoCapacity),
    ("There are no longer any instances available with enough disk space.", None, NoCapacity),
    ("There are not enough free GPUs on the host machine to start this pod.", None, NoCapacity),
    ("This machine does not have the resources to deploy your pod.", "SUPPLY_CONSTRAINT", NoCapacity),
    ("No available machines match your request.", None, NoCapacity),
    ("No GPUs available right now.", None, NoCapacity),
    (BID_REFUSED_MESSAGE, None, NoCapacity),
    ("Insufficient balance", None, Balance),
    ("Your balance is too low to rent this pod.", None, Balance),
    ("Not enough balance to deploy.", None, Balance),
    ("You have reached your spending limit.", None, Balance),
    ("Anything at all", "INSUFFICIENT_BALANCE", Balance),
    ("Anything at all", "SPENDING_LIMIT_EXCEEDED", Balance),
    ("Unknown GPU type 'NVIDIA GeForce GTX 480'.", None, UnknownOffer),
    ("No GPU found with the specified ID", None, UnknownOffer),
    ("GPU type not found", None, UnknownOffer),
    ("Data center not found", None, UnknownOffer),
    ('Cannot query field "podRentInterruptable" on type "Mutation".', "GRAPHQL_VALIDATION_FAILED", UnknownOperation),
    ('Cannot query field "podRentInterruptable" on type "Mutation".', None, UnknownOperation),
    (SOMETHING_WENT_WRONG_MESSAGE, None, Transient),
    ("Internal server error", None, Transient),
    ("The request timed out", None, Transient),
    ("Service temporarily unavailable", None, Transient),
    ("Too many requests", None, Transient),
    ("Rate limit exceeded", None, Transient),
    ("Busy: please try again later", None, Transient),
    ("Anything at all", "RATE_LIMITED", Transient),
    ("Anything at all", "TOO_MANY_REQUESTS", Transient),
    ("Anything at all", "INTERNAL_SERVER_ERROR", Transient),
    ("Anything at all", "SERVICE_UNAVAILABLE", Transient),
    ("Pod not found.", None, PodGone),
    ("That pod was not found", None, PodGone),
    ("Anything at all", "POD_NOT_FOUND", PodGone),
    ("Unauthorized", None, AuthFailed),
    ("Invalid API key", None, AuthFailed),
    ("Forbidden", None, AuthFailed),
    ("You do not have permission to do that", None, AuthFailed),
    ("Anything at all", "UNAUTHENTICATED", AuthFailed),
    ("Anything at all", "FORBIDDEN", AuthFailed),
    ("Syntax Error: Unexpected Name", "GRAPHQL_PARSE_FAILED", BadRequest),
    ("Anything at all", "BAD_USER_INPUT", BadRequest),
    ("A wording nobody has seen yet", None, BadRequest),
]


@pytest.mark.parametrize(("message", "code", "expected"), SEEN)
def test_each_wording_and_code_is_sorted_into_its_error(message, code, expected):
    error = classify_error(message, code)
    assert type(error) is expected
    assert message in str(error) and (code is None or code in str(error))


def test_every_row_of_the_table_has_a_wording_here():
    """A row added to the table without a wording RunPod sends fails here."""
    lowered = [message.lower() for message, _, _ in SEEN]
    assert [phrase for phrase, _ in runpod_api.WORDINGS if not any(phrase in m for m in lowered)] == []
    assert set(runpod_api.ERROR_CODES) == {code for _, code, _ in SEEN if code}


def test_every_wording_the_simulator_sends_is_one_the_table_knows():
    for message, code in CAPACITY_WORDINGS.values():
        assert isinstance(classify_error(message, code), NoCapacity), message
    assert isinstance(classify_error(INSUFFICIENT_BALANCE_MESSAGE, "INSUFFICIENT_BALANCE"), Balance)
    assert isinstance(classify_error(SPENDING_LIMIT_MESSAGE, "INSUFFICIENT_BALANCE"), Balance)
    assert isinstance(classify_error(SPENDING_LIMIT_MESSAGE), Balance)


def test_the_spot_capacity_wording_is_no_capacity_though_it_ends_like_a_transient_fault():
    # Review row 1: "... Please try again later." was read as Transient, three creates and no verdict.
    spot = "There are no instances available with the request specifications. Please try again later."
    assert isinstance(classify_error(spot), NoCapacity)


def _answer(status: int, body: bytes | str, **headers: str) -> Answer:
    return Answer(status, {k.replace("_", "-").lower(): v for k, v in headers.items()},
                  body.encode() if isinstance(body, str) else body)  # fmt: skip


def test_a_429_is_transient_with_the_retry_after_it_names_json_or_html():
    for body in ('{"errors": [{"message": "Too many requests"}]}', "<html>429 Too Many Requests</html>"):
        with pytest.raises(Transient) as raised:
            check_answer(_answer(429, body, retry_after="7"))
        assert raised.value.retry_after == 7.0


def test_an_html_page_is_transient_whatever_its_status():
    for status in (200, 403, 502, 520):
        with pytest.raises(Transient, match="not JSON"):
            check_answer(_answer(status, "<html><body>Attention required | Cloudflare</body></html>"))


def test_a_401_is_auth_failed_and_a_json_403_too():
    with pytest.raises(AuthFailed):
        check_answer(_answer(401, "Unauthorized"))
    with pytest.raises(AuthFailed):
        check_answer(_answer(403, '{"error": "forbidden"}'))


def test_errors_keep_their_code_on_any_status():
    body = '{"errors": [{"message": "nope", "extensions": {"code": "SUPPLY_CONSTRAINT"}}], "data": null}'
    with pytest.raises(NoCapacity, match="SUPPLY_CONSTRAINT"):
        check_answer(_answer(200, body))
    with pytest.raises(Balance):
        check_answer(_answer(400, '{"error": "Insufficient balance"}'))
    with pytest.raises(NoCapacity, match="SUPPLY_CONSTRAINT"):  # REST's shape: its code kept too
        check_answer(_answer(400, '{"error": "odd words", "code": "SUPPLY_CONSTRAINT"}'))


def test_retry_after_reads_seconds_or_a_date_and_is_capped():
    assert retry_after("3") == 3.0
    assert retry_after("-1") == 0.0
    assert retry_after("100000") == runpod_api.MAX_RETRY_AFTER_SECONDS
    assert retry_after("nonsense") is None and retry_after(None) is None
    date = email.utils.formatdate(1_000_030, usegmt=True)
    assert retry_after(date, now=1_000_000) == pytest.approx(30.0)
