"""A report or release the daemon could not settle is sent again, never lost.

The daemon answers `StoreUnavailable` ("lease N could not be settled, retry
the report: ...") to a `Report` or `Release` whose refund it could not apply,
and keeps the lease so that the same settlement can be sent again. The
daemon built from this tree queues a settlement whose Redis call failed and
replays it itself (the last test shows it on a stalled Redis), so that answer
cannot be provoked through Redis: `SettleRefusingProxy` stands between the
client and a real daemon on a real Redis and gives the daemon's answer to the
settlements it is told to refuse, passing everything else through. The bucket
levels, read from the daemon, show each refund applied exactly once.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Optional

import pytest

from ratekeeper import AsyncClient, AsyncLease, Client, StoreUnavailable, UnknownLease
from ratekeeper import _proto as p
from ratekeeper._core.deadlines import SETTLE_RETRY_DELAYS
from ratekeeper._proto.errors import ErrorCode

from _daemon import RedisServer, wait_for
from _proxy import Proxy

CONFIG = """
[[limits]]
name = "exact"
tokens_per_minute = 1
burst_tokens = 1000000
"""
CAPACITY = 1_000_000


class SettleRefusingProxy(Proxy):
    """A proxy that refuses the next `refuse` settlements.

    A refused `Report` or `Release` is answered as the daemon answers one it
    could not apply (`StoreUnavailable`, the lease kept) and never reaches the
    daemon; every other frame goes through, whole, in both directions.
    """

    def __init__(self, upstream: str, directory: Path) -> None:
        #: How many more settlements to refuse.
        self.refuse = 0
        #: Settlements refused, and passed on to the daemon.
        self.refused = 0
        self.forwarded = 0
        super().__init__(upstream, directory)

    def answer_instead(self, request_id: int, request: Any) -> Optional[p.ServerFrame]:
        if not isinstance(request, (p.Report, p.Release)):
            return None
        if self.refuse > 0:
            self.refuse -= 1
            self.refused += 1
            return _refusal(request_id, request)
        self.forwarded += 1
        return None


def _refusal(request_id: int, request: Any) -> p.ServerFrame:
    """The daemon's answer to a settlement it could not apply (src/service/error.rs)."""
    verb, noun = ("settled", "report") if isinstance(request, p.Report) else ("released", "release")
    message = (
        f"lease {request.lease} could not be {verb}, retry the {noun}: store unavailable: timed out"
    )
    return p.ServerFrame(request_id, p.ErrorReply(ErrorCode.STORE_UNAVAILABLE, message))


class OnLoop:
    """An `AsyncClient` or `AsyncLease` whose calls block: each runs on `loop`.

    Lets one test body drive both clients: a coroutine a method returns is run
    to completion, and a lease it returns is wrapped the same way.
    """

    def __init__(self, target: Any, loop: asyncio.AbstractEventLoop) -> None:
        self._target = target
        self._loop = loop

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._target, name)
        if not callable(attribute):
            return attribute

        def call(*args: Any, **kwargs: Any) -> Any:
            result = attribute(*args, **kwargs)
            if inspect.isawaitable(result):
                result = self._loop.run_until_complete(asyncio.wait_for(result, 30))
            return OnLoop(result, self._loop) if isinstance(result, AsyncLease) else result

        return call


@pytest.fixture(params=["sync", "async"])
def connect(request):
    """Opens a `Client`, or an `AsyncClient` on a loop of its own, on a socket."""
    opened: list[Any] = []
    loop = asyncio.new_event_loop() if request.param == "async" else None

    def open_client(path: str) -> Any:
        if loop is None:
            opened.append(Client(path, timeout=5))
        else:
            opened.append(OnLoop(AsyncClient(path, timeout=5), loop))
        return opened[-1]

    yield open_client
    for client in opened:
        client.close()
    if loop is not None:
        loop.close()


@pytest.fixture
def proxy(make_daemon, tmp_path) -> Iterator[SettleRefusingProxy]:
    """The proxy in front of a daemon of the test's own on the session's Redis."""
    refusing = SettleRefusingProxy(make_daemon(CONFIG, store="redis").socket, tmp_path)
    yield refusing
    refusing.close()


def level(client: Any) -> int:
    return client.status("exact").limit("exact").bucket("tokens").level


def test_a_report_the_daemon_could_not_settle_is_sent_again(proxy, connect):
    client = connect(proxy.path)
    lease = client.acquire("exact", 1000)
    proxy.refuse = 2
    assert lease.report(100) == 900
    assert (proxy.refused, proxy.forwarded) == (2, 1)
    assert lease.settled
    assert lease.tokens_returned == 900
    assert level(client) == CAPACITY - 100  # refunded once


def test_a_release_the_daemon_could_not_settle_is_sent_again(proxy, connect):
    client = connect(proxy.path)
    lease = client.acquire("exact", 1000)
    proxy.refuse = len(SETTLE_RETRY_DELAYS)  # the last attempt goes through
    assert lease.release() == 1000
    assert (proxy.refused, proxy.forwarded) == (len(SETTLE_RETRY_DELAYS), 1)
    assert level(client) == CAPACITY


def test_a_settlement_still_refused_after_the_last_attempt_raises(proxy, connect):
    client = connect(proxy.path)
    lease = client.acquire("exact", 1000)
    proxy.refuse = 1000
    with pytest.raises(StoreUnavailable, match="retry the report"):
        lease.report(100)
    assert (proxy.refused, proxy.forwarded) == (len(SETTLE_RETRY_DELAYS) + 1, 0)
    assert not lease.settled  # the daemon kept it: it can still be settled
    proxy.refuse = 0
    assert lease.release() == 1000
    assert level(client) == CAPACITY


def test_an_unknown_lease_is_not_sent_again(proxy, connect):
    client = connect(proxy.path)
    lease = client.acquire("exact", 1000)
    assert lease.report(1000) == 0
    with pytest.raises(UnknownLease):
        lease.report(100)
    assert (proxy.refused, proxy.forwarded) == (0, 2)
    assert level(client) == CAPACITY - 1000


def test_a_report_during_a_redis_stall_is_applied_once(make_daemon, connect):
    """The daemon's own path: a Redis call past `timeout_ms` is cancelled, the
    report answered `Settled` and its refund replayed once Redis answers."""
    redis = RedisServer()
    try:
        daemon = make_daemon(CONFIG, redis_url=redis.url, redis_options="timeout_ms = 200\n")
        client = connect(daemon.socket)
        lease = client.acquire("exact", 1000)
        assert redis.command("CLIENT", "PAUSE", "60000", "WRITE") == b"+OK\r\n"
        try:
            assert lease.report(100) == 900
        finally:
            redis.command("CLIENT", "UNPAUSE")
        assert "shared store unavailable" in daemon.log()  # the report met the stall
        replayed = "settlements made during the outage are applied"
        wait_for(lambda: replayed in daemon.log(), 10, "the report to be replayed")
        assert level(client) == CAPACITY - 100
    finally:
        redis.close()
