"""What a pod's HTTP status makes of a page's attempt (ocrjobs/dispatch/outcomes.py)."""

from __future__ import annotations

import pytest

from ocrjobs.dispatch.outcomes import PROXY_TIMEOUT_ERROR, Failure, status_failure


@pytest.mark.parametrize("status", [400, 413, 415])
def test_a_page_the_pod_refuses_fails_for_good_without_blaming_the_pod(status):
    assert status_failure(status, "bad page") == Failure("the pod refused the page: bad page", final=True)


def test_a_page_the_pod_timed_out_spends_an_attempt_with_the_pods_own_error():
    assert status_failure(504, "page timed out after 90 s") == Failure("page timed out after 90 s")


def test_runpods_proxy_cut_is_an_attempt_explained_not_the_pods_fault():
    assert status_failure(524, "<html>cloudflare</html>") == Failure(PROXY_TIMEOUT_ERROR)


@pytest.mark.parametrize("status", [500, 502, 503, 404])
def test_any_other_status_is_the_pods_fault(status):
    assert status_failure(status, "boom") == Failure(f"HTTP {status}: boom", pod_fault=True)
