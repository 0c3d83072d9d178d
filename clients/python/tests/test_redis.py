"""Sidecars sharing one Redis: one limit for the whole fleet, and Redis failures."""

from __future__ import annotations

import multiprocessing

import pytest

from ratekeeper import Client, RateLimited, StoreUnavailable

from _daemon import RedisServer
from _workers import hammer

CONFIG = """
[[limits]]
name = "fleet"
tokens_per_minute = 120000
burst_tokens = 2000

[[limits]]
name = "exact"
tokens_per_minute = 1
burst_tokens = 1000000
"""
RATE = 2000.0  # tokens per second of "fleet"


def test_two_sidecars_draw_from_the_same_buckets(make_daemon, redis_server):
    first = make_daemon(CONFIG, redis_url=redis_server.url, key_prefix="shared-1")
    second = make_daemon(CONFIG, redis_url=redis_server.url, key_prefix="shared-1")
    with Client(first.socket) as a, Client(second.socket) as b:
        assert a.status().store == "redis"
        lease = a.acquire("exact", 400_000, max_tokens=100_000)
        level = b.status("exact").limit("exact").bucket("tokens").level
        assert level == 1_000_000 - 500_000  # the other sidecar sees the reservation
        assert lease.report(300_000) == 200_000
        assert b.status("exact").limit("exact").bucket("tokens").level == 1_000_000 - 300_000
        b.acquire("exact", 700_000, max_wait=0).report(700_000)
        with pytest.raises(RateLimited):
            a.acquire("exact", 10, max_wait=0)


def test_four_processes_through_two_sidecars_share_one_limit(make_daemon, redis_server):
    sidecars = [
        make_daemon(CONFIG, redis_url=redis_server.url, key_prefix="shared-2") for _ in range(2)
    ]
    with Client(sidecars[0].socket) as client:
        # The declared burst less the default headroom: the bound is the real bucket's.
        capacity = client.status("fleet").limit("fleet").bucket("tokens").capacity
    assert capacity < 2000
    spawn = multiprocessing.get_context("spawn")
    barrier, results = spawn.Barrier(4), spawn.Queue()
    processes = [
        spawn.Process(
            target=hammer,
            args=(sidecars[index % 2].socket, "fleet", 8, 2.0, 50, barrier, results),
        )
        for index in range(4)
    ]
    for process in processes:
        process.start()
    totals = [results.get(timeout=60) for _ in processes]
    for process in processes:
        process.join(30)
        assert process.exitcode == 0
    assert [t["errors"] for t in totals] == [[]] * 4
    granted = sum(t["tokens"] for t in totals)
    elapsed = max(t["last_grant"] for t in totals) - min(t["first_sent"] for t in totals)
    # One limit for both sidecars: not twice the rate, however the work is split.
    assert granted <= capacity + RATE * elapsed, (granted, elapsed)
    assert granted >= capacity + 0.5 * RATE * (elapsed - 0.5), (granted, elapsed)


def test_a_failing_redis_surfaces_as_store_unavailable(make_daemon):
    redis = RedisServer()
    try:
        daemon = make_daemon(CONFIG, redis_url=redis.url, on_failure="fail_closed")
        with Client(daemon.socket, timeout=5) as client:
            client.acquire("exact", 10).report(10)
            redis.close()
            with pytest.raises(StoreUnavailable) as caught:
                client.acquire("exact", 10, max_wait=0)
            assert caught.value.code == 13
            assert caught.value.retryable
            assert client.ping() < 1  # the sidecar itself is fine
    finally:
        redis.close()
