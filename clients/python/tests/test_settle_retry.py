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
import contextlib
import inspect
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ratekeeper import AsyncClient, AsyncLease, Client, StoreUnavailable, UnknownLease
from ratekeeper import _proto as p
from ratekeeper._core.deadlines import SETTLE_RETRY_DELAYS
from ratekeeper._proto.errors import ErrorCode

from _daemon import RedisServer, wait_for

CONFIG = """
[[limits]]
name = "exact"
tokens_per_minute = 1
burst_tokens = 1000000
"""
CAPACITY = 1_000_000


def _frames(sock: socket.socket) -> Iterator[bytes]:
    """The whole frames (length prefix and payload) read from `sock`, until it closes."""
    buffer = b""
    while True:
        data = sock.recv(65536)
        if not data:
            return
        buffer += data
        while len(buffer) >= p.LENGTH_PREFIX_LEN:
            end = p.LENGTH_PREFIX_LEN + int.from_bytes(buffer[: p.LENGTH_PREFIX_LEN], "little")
            if len(buffer) < end:
                break
            yield buffer[:end]
            buffer = buffer[end:]


class SettleRefusingProxy:
    """A socket in front of the daemon that refuses the next `refuse` settlements.

    A refused `Report` or `Release` is answered as the daemon answers one it
    could not apply (`StoreUnavailable`, the lease kept) and never reaches the
    daemon; every other frame goes through, whole, in both directions.
    """

    def __init__(self, upstream: str, directory: Path) -> None:
        self.upstream = upstream
        self.path = str(directory / "proxy.sock")
        #: How many more settlements to refuse.
        self.refuse = 0
        #: Settlements refused, and passed on to the daemon.
        self.refused = 0
        self.forwarded = 0
        self._sockets: list[socket.socket] = []
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(self.path)
        self._listener.listen(8)
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
                daemon = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                daemon.connect(self.upstream)
            except OSError:
                return  # closed
            self._sockets += [client, daemon]
            to_client = threading.Lock()  # answers and refusals never interleave
            threading.Thread(
                target=self._answers, args=(daemon, client, to_client), daemon=True
            ).start()
            threading.Thread(
                target=self._requests, args=(client, daemon, to_client), daemon=True
            ).start()

    @staticmethod
    def _answers(daemon: socket.socket, client: socket.socket, to_client: threading.Lock) -> None:
        with contextlib.suppress(OSError):
            for frame in _frames(daemon):
                with to_client:
                    client.sendall(frame)
            client.shutdown(socket.SHUT_WR)

    def _requests(
        self, client: socket.socket, daemon: socket.socket, to_client: threading.Lock
    ) -> None:
        with contextlib.suppress(OSError):
            for frame in _frames(client):
                message = p.decode_payload(frame[p.LENGTH_PREFIX_LEN :], p.ClientFrame)
                request = message.request
                if isinstance(request, (p.Report, p.Release)) and self.refuse > 0:
                    self.refuse -= 1
                    self.refused += 1
                    with to_client:
                        client.sendall(p.encode_frame(_refusal(message.request_id, request)))
                    continue
                if isinstance(request, (p.Report, p.Release)):
                    self.forwarded += 1
                daemon.sendall(frame)
            daemon.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        for sock in [self._listener, *self._sockets]:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()


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
