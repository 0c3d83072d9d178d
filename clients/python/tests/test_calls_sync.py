# Generated from tests/test_calls_async.py by scripts/unasync.py: do not edit.
# Edit the source, then run `python scripts/unasync.py` in clients/python.
"""The calls of the client against the real daemon, written once for asyncio.

`scripts/unasync.py` generates `test_calls_sync.py` from this file, the same
tests for the blocking client, as it generates the client itself; conftest.py
runs these coroutines, each in an event loop of its own. What only one of
the clients does (tasks, threads, event loops, forks) is tested in
`test_async.py` and `test_client.py`.
"""

from __future__ import annotations

import warnings

import pytest

from ratekeeper import (
    Client,
    CostExceedsCapacity,
    RateLimited,
    SidecarUnavailable,
    SidecarUnavailableWarning,
    UnknownLimit,
)

CONFIG = """
[[limits]]
name = "exact"
tokens_per_minute = 1
burst_tokens = 1000000

[[limits]]
name = "slow"
tokens_per_minute = 60
burst_tokens = 1

[[priorities]]
name = "default"
max_wait_ms = 10000
"""
CAPACITY = 1_000_000


def level(client: Client, limit: str) -> int:
    status = client.status(limit)
    return status.limit(limit).bucket("tokens").level


def test_acquire_report_release_and_reserve(make_daemon, store):
    daemon = make_daemon(CONFIG, store=store)
    with Client(daemon.socket) as client:
        assert client.ping() < 1
        lease = client.acquire("exact", 300, max_tokens=200)
        assert (lease.tokens, lease.waited) == (500, 0.0)
        assert lease.report(input_tokens=280, output_tokens=20) == 200
        assert level(client, "exact") == CAPACITY - 300

        unused = client.acquire("exact", 50)
        assert unused.release() == 50

        def fail_in_the_block() -> None:
            with client.reserve("exact", 100):
                raise ValueError("boom")

        with pytest.raises(ValueError, match="boom"):
            fail_in_the_block()
        assert level(client, "exact") == CAPACITY - 300

        with client.reserve("exact", 100, max_tokens=100) as kept:
            pass
        assert kept.tokens_returned == 0
        assert level(client, "exact") == CAPACITY - 500

        estimate = client.estimate("exact", 10, max_tokens=5)
        assert (estimate.input_tokens, estimate.output_tokens) == (10, 5)


def test_errors_raise_their_exceptions(make_daemon):
    daemon = make_daemon(CONFIG)
    with Client(daemon.socket) as client:
        with pytest.raises(UnknownLimit):
            client.acquire("nope", 1)
        with pytest.raises(CostExceedsCapacity):
            client.acquire("slow", 2)
        whole_burst = client.acquire("slow", 1, max_wait=0)
        whole_burst.report(1)
        with pytest.raises(RateLimited) as caught:
            client.acquire("slow", 1, max_wait=0)
        assert 0 < caught.value.retry_after <= 1.0


def test_allow_mode_when_the_sidecar_is_missing(tmp_path):
    client = Client(str(tmp_path / "none.sock"), timeout=0.2, on_unavailable="allow")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        lease = client.acquire("exact", 10)
    assert lease.unlimited
    assert lease.report(10) is None
    assert [w.category for w in caught] == [SidecarUnavailableWarning]
    with pytest.raises(SidecarUnavailable):
        client.status()
