"""bench/pods_client.py at a small size: each client has every POST it sends answered, over TLS and
plain HTTP. It takes no database: it runs on the embedded default's run only."""

from __future__ import annotations

import os

import pytest

from tests.bench.conftest import assert_goals, run_bench

pytestmark = pytest.mark.skipif(bool(os.environ.get("DATABASE_URL")), reason="no database: runs on the SQLite run")


@pytest.mark.e2e
@pytest.mark.timeout(120)
@pytest.mark.parametrize("scheme", ["https", "http"])
def test_both_clients_have_every_request_answered(scheme):
    plain = ["--plain"] if scheme == "http" else []
    figures = run_bench(
        "pods_client.py", "--requests", "2000", "--in-flight", "32", "--rounds", "1", *plain, database=False
    )
    assert_goals(figures, "every_request_answered")
    assert figures["scheme"] == scheme and figures["answered"] == {"aiohttp": 2048, "pod_client": 2048}
