"""Fixtures: the real daemon on a private socket, clients connected to it, and a
fake OpenAI provider; and `async def` tests run in an event loop of their own."""

from __future__ import annotations

import asyncio
import inspect
import itertools
import os
from collections.abc import Iterator

import pytest

from ratekeeper import Client

from _daemon import Daemon, RedisServer, daemon_binary
from _fake_openai import FakeProvider

#: The configuration of the session's daemon. Every test that looks at bucket
#: levels uses a limit of its own (or a daemon of its own), so tests never see
#: each other's reservations.
CONFIG = """
default_priority = "interactive"

[[limits]]
name = "basic"
tokens_per_minute = 60000000
burst_tokens = 10000000

[[limits]]
name = "tiny"
tokens_per_minute = 60
burst_tokens = 10

[[limits]]
name = "capped"
tokens_per_minute = 100000
max_request_tokens = 500

[[limits]]
name = "requests"
tokens_per_minute = 60000000
burst_tokens = 10000000
requests_per_minute = 60
burst_requests = 2

[[priorities]]
name = "interactive"
max_wait_ms = 5000

[[priorities]]
name = "batch"
reserved_fraction = 0.5
max_wait_ms = 5000
limits = ["basic"]
"""

#: A limit that barely refills (one token a minute), so levels can be asserted
#: exactly, and one whose waits are exact (no burst headroom: its 1000 tokens
#: are all usable); a fresh daemon per test keeps them independent.
EXACT_CONFIG = """
# Acquires may wait up to an hour (a class's wait caps what an acquire asks).
[[priorities]]
name = "patient"
max_wait_ms = 3600000

[[limits]]
name = "exact"
tokens_per_minute = 1
burst_tokens = 1000000

[[limits]]
name = "metered"
tokens_per_minute = 60000
burst_tokens = 1000
burst_headroom_ms = 0
"""


def pytest_report_header(config):
    try:
        return f"ratekeeper daemon: {daemon_binary()}"
    except RuntimeError as error:
        return str(error)


@pytest.fixture(scope="session")
def daemon(request) -> Iterator[Daemon]:
    """One daemon for the whole session, for tests that need no private buckets."""
    running = Daemon(CONFIG).start()
    yield running
    if request.session.testsfailed:
        print(f"\n--- session daemon log (tail) ---\n{running.log()[-4000:]}")
    running.close()


#: The bucket stores a daemon can run: its own memory, or Redis shared by sidecars.
STORES = ["embedded", "redis"]
_prefixes = itertools.count(1)


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """One redis-server for the session; each daemon on it gets its own key prefix."""
    server = RedisServer()
    yield server
    server.close()


@pytest.fixture(params=STORES)
def store(request) -> str:
    """Runs a test once per bucket store; pass it to `make_daemon(..., store=store)`."""
    return request.param


@pytest.fixture
def make_daemon(request):
    """Starts daemons of the test's own; killed (log printed on failure) afterwards.

    `store="redis"` points the daemon at the session's Redis under a fresh key
    prefix (unless `redis_url` / `key_prefix` are given), so buckets never leak
    between tests.
    """
    started: list[Daemon] = []

    def make(config: str = EXACT_CONFIG, store: str = "embedded", **options) -> Daemon:
        if store == "redis" and "redis_url" not in options:
            options["redis_url"] = request.getfixturevalue("redis_server").url
        if options.get("redis_url") and "key_prefix" not in options:
            options["key_prefix"] = f"rk-py-{os.getpid()}-{next(_prefixes)}"
        daemon = Daemon(config, **options).start()
        started.append(daemon)
        return daemon

    yield make
    failed = getattr(request.node, "rep_call", None)
    for daemon in started:
        if failed is not None and failed.failed:
            print(f"\n--- daemon log ---\n{daemon.log()[-6000:]}")
        daemon.close()


@pytest.fixture
def provider() -> Iterator[FakeProvider]:
    """A fake OpenAI provider of the test's own (test_anthropic.py has an Anthropic one)."""
    fake = FakeProvider()
    yield fake
    fake.close()


@pytest.fixture
def client(daemon) -> Iterator[Client]:
    with Client(daemon.socket, timeout=5.0) as connected:
        yield connected


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    setattr(item, f"rep_{report.when}", report)


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    """Runs an `async def` test in an event loop of its own. The asyncio tests
    whose blocking twins `scripts/unasync.py` generates (`test_calls_async.py`
    and its `test_calls_sync.py`) are plain coroutines, so that deleting
    `async` and `await` leaves the blocking test; no plugin is needed."""
    test = pyfuncitem.obj
    if not inspect.iscoroutinefunction(test):
        return None
    arguments = {name: pyfuncitem.funcargs[name] for name in pyfuncitem._fixtureinfo.argnames}
    asyncio.run(test(**arguments))
    return True
