"""The asyncio client against the real daemon: what only it does (tasks, event
loops). The calls both clients make are in `test_calls_async.py`."""

from __future__ import annotations

import asyncio
import time

import pytest

from ratekeeper import (
    AsyncClient,
)

CONFIG = """
[[limits]]
name = "exact"
tokens_per_minute = 1
burst_tokens = 1000000

[[limits]]
name = "busy"
tokens_per_minute = 60000
burst_tokens = 1000

[[limits]]
name = "slow"
tokens_per_minute = 60
burst_tokens = 1

[[priorities]]
name = "default"
max_wait_ms = 10000
"""
CAPACITY = 1_000_000


def run(coroutine, timeout: float = 30):
    return asyncio.run(asyncio.wait_for(coroutine, timeout))


async def level(client: AsyncClient, limit: str) -> int:
    status = await client.status(limit)
    return status.limit(limit).bucket("tokens").level


def test_two_hundred_concurrent_tasks(make_daemon, store):
    daemon = make_daemon(CONFIG, store=store)
    tasks, tokens = 200, 10  # 2000 tokens: the bucket's 800, then 1200 at 1000/s

    async def one(client: AsyncClient) -> tuple[int, float]:
        lease = await client.acquire("busy", tokens, max_wait=5)
        received = time.monotonic()
        await lease.report(tokens)
        return lease.tokens, received

    async def main():
        async with AsyncClient(daemon.socket) as client:
            started = time.monotonic()  # not connected yet: every task asks at once
            results = await asyncio.gather(*(one(client) for _ in range(tasks)))
            elapsed = max(received for _, received in results) - started
            # The declared burst less the default headroom: the real bucket's.
            status = await client.status("busy")
            capacity = status.limit("busy").bucket("tokens").capacity
            return sum(granted for granted, _ in results), elapsed, capacity

    granted, elapsed, capacity = run(main())
    assert daemon.log().count("client said hello") == 1  # one connection for all tasks
    assert granted == tasks * tokens  # every task answered, every one granted
    # Admitted work over T is at most capacity + rate * T: the last grants waited.
    assert capacity < 1000
    assert granted <= capacity + 1000 * elapsed
    assert 0.9 <= elapsed < 5


def test_a_cancelled_task_gives_its_reservation_back(make_daemon, store):
    daemon = make_daemon(CONFIG, store=store)

    async def main():
        async with AsyncClient(daemon.socket) as client:
            await (await client.acquire("slow", 1)).report(1)  # the whole burst
            waiting = asyncio.create_task(client.acquire("slow", 1, max_wait=10))
            while (await client.status("slow")).limit("slow").waiters != 1:
                await asyncio.sleep(0.005)
            assert await level(client, "slow") < 0  # reserved ahead of refill
            waiting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiting
            # The daemon got Cancel: the waiter is gone and the tokens are back.
            while (await client.status("slow")).limit("slow").waiters != 0:
                await asyncio.sleep(0.005)
            assert await level(client, "slow") >= 0

    run(main())


def test_one_client_serves_successive_event_loops(make_daemon):
    daemon = make_daemon(CONFIG)
    client = AsyncClient(daemon.socket)

    async def use() -> int:
        return await (await client.acquire("exact", 5)).report(5)

    assert run(use()) == 0
    assert run(use()) == 0  # a new loop: a new connection, not the dead loop's
