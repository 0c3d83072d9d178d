"""Fixtures: the real daemon on a private socket, and clients connected to it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ratekeeper import Client

from _daemon import Daemon, daemon_binary

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
#: exactly; a fresh daemon per test keeps them independent.
EXACT_CONFIG = """
[[limits]]
name = "exact"
tokens_per_minute = 1
burst_tokens = 1000000

[[limits]]
name = "metered"
tokens_per_minute = 60000
burst_tokens = 1000
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


@pytest.fixture
def make_daemon(request):
    """Starts daemons of the test's own; killed (log printed on failure) afterwards."""
    started: list[Daemon] = []

    def make(config: str = EXACT_CONFIG, **options) -> Daemon:
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
def client(daemon) -> Iterator[Client]:
    with Client(daemon.socket, timeout=5.0) as connected:
        yield connected


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    setattr(item, f"rep_{report.when}", report)
