"""The asyncio client: the same design as the blocking one, on one event loop.

Every task sends on one pipelined connection under its own request id and
awaits a future; a reader task completes the futures as answers arrive, in any
order. A task cancelled while its acquire waits sends `Cancel` (and releases
the lease if the grant crossed the cancel). The connection belongs to the
event loop and the process that opened it; a different loop or a forked child
opens its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
import warnings
from collections.abc import AsyncIterator, Iterable
from typing import Any, Optional, Union

from . import _core as core
from . import _protocol as p
from ._errors import (
    ErrorCode,
    ProtocolError,
    RatekeeperError,
    SidecarUnavailable,
    closes_connection,
)
from ._sync import SidecarUnavailableWarning

log = logging.getLogger("ratekeeper")

_RECV_SIZE = 64 * 1024


class _ConnectionLost(SidecarUnavailable):
    """The connection broke under a request; the call may retry on a new one."""


class _Connection:
    """One asyncio stream to the daemon that has exchanged `Hello`, and its reader task."""

    def __init__(
        self,
        session: core.Session,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        leftover: list[p.ServerFrame],
    ) -> None:
        self.pid = os.getpid()
        self.loop = asyncio.get_running_loop()
        self.session = session
        self._reader = reader
        self._writer = writer
        self._pending: dict[int, asyncio.Future] = {}
        self._counted: set[int] = set()
        self._closed: Optional[_ConnectionLost] = None
        self.retired = False
        self._slots = asyncio.Semaphore(session.max_in_flight)
        self._drain_lock = asyncio.Lock()
        for frame in leftover:
            self._deliver(frame)
        self._task = self.loop.create_task(self._read_loop())

    @classmethod
    async def open(cls, path: str, client_name: str) -> _Connection:
        reader, writer = await asyncio.open_unix_connection(path, limit=_RECV_SIZE)
        try:
            session = core.Session(client_name)
            hello_id, hello = session.hello_frame()
            writer.write(hello)
            frames: list[p.ServerFrame] = []
            while not frames:
                data = await reader.read(_RECV_SIZE)
                if not data:
                    raise ConnectionResetError("the daemon closed the connection during Hello")
                frames = list(session.receive_data(data))
            if frames[0].request_id not in (hello_id, 0):
                raise ProtocolError(f"answer to request {frames[0].request_id} before Hello")
            session.accept_hello(frames[0])
        except BaseException:
            writer.transport.abort()
            raise
        return cls(session, reader, writer, frames[1:])

    @property
    def alive(self) -> bool:
        """Open, in this process and on the running loop: its leases can be settled on it."""
        if self._closed is not None or self.pid != os.getpid():
            return False
        try:
            return asyncio.get_running_loop() is self.loop
        except RuntimeError:
            return False

    @property
    def usable(self) -> bool:
        return self.alive and not self.retired

    async def submit(self, request: p.Request) -> tuple[int, asyncio.Future]:
        """Sends `request`; the future completes with its answer or `_ConnectionLost`."""
        counted = core.counts_in_flight(request)
        if counted:
            await self._slots.acquire()
        if self._closed is not None:
            if counted:
                self._slots.release()
            raise self._closed
        request_id, data = self.session.request_frame(request)
        future = self.loop.create_future()
        self._pending[request_id] = future
        if counted:
            self._counted.add(request_id)
        try:
            self._writer.write(data)
            if self._writer.transport.get_write_buffer_size() > _RECV_SIZE:
                async with self._drain_lock:
                    await self._writer.drain()
        except (OSError, RuntimeError) as error:
            self._fail(_ConnectionLost(f"sending failed: {error}"))
        return request_id, future

    def send_and_forget(self, request: p.Request) -> None:
        """Sends a request whose answer nobody awaits (cancels, late releases)."""
        if self._closed is not None or self.pid != os.getpid():
            return
        _, data = self.session.request_frame(request)
        try:
            self._writer.write(data)
        except (OSError, RuntimeError) as error:
            log.debug("could not send %s: %s", type(request).__name__, error)

    async def _read_loop(self) -> None:
        try:
            while True:
                data = await self._reader.read(_RECV_SIZE)
                if not data:
                    reason = _ConnectionLost("the daemon closed the connection")
                    break
                for frame in self.session.receive_data(data):
                    self._deliver(frame)
        except ProtocolError as error:
            log.error("closing the connection to the sidecar: %s", error)
            reason = _ConnectionLost(f"protocol error: {error}")
        except OSError as error:
            reason = _ConnectionLost(str(error))
        except asyncio.CancelledError:
            reason = _ConnectionLost("the client was closed")
        self._fail(reason)
        self._writer.transport.abort()

    def _deliver(self, frame: p.ServerFrame) -> None:
        if frame.request_id == 0:
            response = frame.response
            if isinstance(response, p.ErrorReply) and closes_connection(response.code):
                raise response.exception()
            log.warning("the sidecar sent a connection-level answer: %r", response)
            return
        future = self._pending.pop(frame.request_id, None)
        if frame.request_id in self._counted:
            self._counted.discard(frame.request_id)
            self._slots.release()
        if future is not None and not future.done():
            future.set_result(frame.response)

    def _fail(self, reason: _ConnectionLost) -> None:
        if self._closed is not None:
            return
        self._closed = reason
        pending, self._pending = self._pending, {}
        for _ in self._counted:
            self._slots.release()
        self._counted.clear()
        for future in pending.values():
            if not future.done():
                future.set_exception(reason)
                future.exception()  # retrieved: an abandoned future must not warn

    async def close(self) -> None:
        self._fail(_ConnectionLost("the client was closed"))
        self._task.cancel()
        self._writer.transport.abort()
        # The reader ends with the cancellation; a cancellation of our caller still propagates.
        await asyncio.gather(self._task, return_exceptions=True)

    def abort(self) -> None:
        """Drops the connection without awaiting (another loop, or a forked child)."""
        self._closed = self._closed or _ConnectionLost("abandoned")
        if self.pid == os.getpid():
            with contextlib.suppress(Exception):
                self._writer.transport.abort()
        # In a forked child the transport is left alone: closing it would run
        # the parent's loop machinery; the descriptor goes when the child exits.


def _retrieve(task: asyncio.Task) -> None:
    """Marks a connect task's failure as seen when no caller awaited it any more."""
    if not task.cancelled():
        task.exception()


class AsyncLease(core.LeaseBase):
    """A reservation granted by the daemon; `await lease.report(...)` or `release()` once.

    Settled on the connection that acquired it; if that connection is gone, the
    daemon already forgot the lease (keeping its reservation) and settling it
    returns None.
    """

    def __init__(self, client: AsyncClient, conn: Optional[_Connection], *args: Any) -> None:
        super().__init__(*args)
        self._client = client
        self._conn = conn

    async def report(
        self,
        used: Optional[int] = None,
        *,
        input_tokens: Optional[int] = None,
        output_tokens: Optional[int] = None,
    ) -> Optional[int]:
        """Settles the lease with the provider's usage; returns the tokens given back."""
        counts = core.report_counts(used, input_tokens, output_tokens)
        return await self._settle(p.Report(self.lease_id or 0, *counts), p.Settled)

    async def release(self) -> Optional[int]:
        """Gives the whole reservation back: the provider was never called."""
        return await self._settle(p.Release(self.lease_id or 0), p.Released)

    async def settle_as_reserved(self) -> Optional[int]:
        """Reports exactly what was reserved: keeps the reservation, closes the lease."""
        reserved = self.reserved
        return await self.report(
            input_tokens=reserved.input_tokens, output_tokens=reserved.output_tokens
        )

    async def _settle(self, request: p.Request, kind: type) -> Optional[int]:
        if self.unlimited:
            self.settled = True
            return None
        conn = self._conn
        try:
            if conn is None or not conn.alive:
                raise _ConnectionLost("gone")
            response = await self._client._request_on(conn, request)
        except _ConnectionLost:
            self.settled = True
            log.info("lease %s was lost with its connection; the daemon kept it", self.lease_id)
            return None
        try:
            answer = core.expect(response, kind)
        except RatekeeperError as error:
            if error.code == ErrorCode.UNKNOWN_LEASE:
                self.settled = True
            raise
        self.settled = True
        self.tokens_returned = answer.tokens_returned
        return answer.tokens_returned

    async def __aenter__(self) -> AsyncLease:
        return self

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        await self._client._finish(self, exc)


class AsyncClient:
    """The asyncio counterpart of `Client`, with the same options and semantics."""

    def __init__(
        self,
        socket: Optional[Union[str, os.PathLike]] = None,
        *,
        name: Optional[str] = None,
        timeout: float = core.DEFAULT_TIMEOUT,
        on_unavailable: str = "raise",
    ) -> None:
        self.socket_path = core.socket_path(socket)
        self.name = name
        self.timeout = timeout
        self.on_unavailable = core.check_on_unavailable(on_unavailable)
        self._conn: Optional[_Connection] = None
        self._connecting: Optional[asyncio.Task] = None
        self._down = False

    # -- connections --------------------------------------------------------

    async def _connection(self, deadline: core.Deadline) -> _Connection:
        conn = self._conn
        if conn is not None and conn.usable:
            return conn
        loop = asyncio.get_running_loop()
        if conn is not None and not conn.alive and conn.loop is not loop:
            conn.abort()  # opened on another loop or in the parent process
        connecting = self._connecting
        if connecting is None or connecting.done() or connecting.get_loop() is not loop:
            # One task connects, for every caller; cancelling a caller does not stop it.
            connecting = loop.create_task(self._connect_and_keep(deadline))
            connecting.add_done_callback(_retrieve)
            self._connecting = connecting
        try:
            return await asyncio.wait_for(asyncio.shield(connecting), deadline.remaining())
        except asyncio.TimeoutError:
            raise core.unavailable(self.socket_path, None) from None

    async def _connect_and_keep(self, deadline: core.Deadline) -> _Connection:
        conn = await self._connect(deadline)
        self._conn = conn
        return conn

    async def _connect(self, deadline: core.Deadline) -> _Connection:
        name = self.name or core.default_client_name()
        last: Optional[BaseException] = None
        for delay in core.reconnect_delays():
            try:
                remaining = deadline.remaining()
                conn = await asyncio.wait_for(
                    _Connection.open(self.socket_path, name),
                    None if remaining is None else max(remaining, 0.05),
                )
            except (OSError, asyncio.TimeoutError) as error:
                last = error
            else:
                if self._down:
                    log.warning("the ratekeeper sidecar at %s is reachable again", self.socket_path)
                self._down = False
                return conn
            remaining = deadline.remaining()
            if self._down or remaining == 0:
                break
            await asyncio.sleep(delay if remaining is None else min(delay, remaining))
        if not self._down:
            log.warning("the ratekeeper sidecar at %s is unavailable: %s", self.socket_path, last)
        self._down = True
        raise core.unavailable(self.socket_path, last)

    async def _wait(
        self,
        conn: _Connection,
        request_id: int,
        future: asyncio.Future,
        request: p.Request,
        deadline: core.Deadline,
    ) -> p.Response:
        try:
            return await asyncio.wait_for(asyncio.shield(future), deadline.remaining())
        except asyncio.TimeoutError:
            self._abandon(conn, request_id, future, request)
            raise SidecarUnavailable(
                f"no answer from the sidecar within {self.timeout}s of the deadline"
            ) from None
        except asyncio.CancelledError:
            self._abandon(conn, request_id, future, request)
            raise

    @staticmethod
    def _abandon(
        conn: _Connection, request_id: int, future: asyncio.Future, request: p.Request
    ) -> None:
        if not isinstance(request, p.Acquire):
            return
        conn.send_and_forget(p.Cancel(request_id))

        def release_late_grant(done: asyncio.Future) -> None:
            if done.cancelled() or done.exception() is not None:
                return
            if isinstance(done.result(), p.Granted):
                conn.send_and_forget(p.Release(done.result().lease))

        future.add_done_callback(release_late_grant)

    async def _request_on(self, conn: _Connection, request: p.Request) -> p.Response:
        deadline = core.Deadline(self.timeout)
        request_id, future = await conn.submit(request)
        return await self._wait(conn, request_id, future, request, deadline)

    async def _call(self, request: p.Request) -> p.Response:
        deadline = core.Deadline(self.timeout)
        while True:
            conn = await self._connection(deadline)
            try:
                return await self._request_on(conn, request)
            except _ConnectionLost:
                if deadline.expired:
                    raise

    # -- the API ------------------------------------------------------------

    async def acquire(
        self,
        limit: str,
        tokens: Optional[int] = None,
        *,
        messages: Optional[Iterable[core.MessageLike]] = None,
        max_tokens: Optional[int] = None,
        tools: Any = None,
        tenant: Optional[str] = None,
        priority: Optional[str] = None,
        max_wait: Optional[float] = None,
    ) -> AsyncLease:
        """Reserves tokens in `limit`; see `Client.acquire`."""
        request = core.build_acquire(
            limit, tokens, messages, max_tokens, tools, tenant, priority, max_wait
        )
        started = time.monotonic()
        overall = core.Deadline(None if max_wait is None else max_wait + self.timeout)
        retry_until: Optional[core.Deadline] = None
        while True:
            try:
                conn = await self._connection(retry_until or overall.earlier(self.timeout))
            except (SidecarUnavailable, asyncio.TimeoutError) as error:
                return self._unavailable(limit, request, error)
            attempt = core.with_remaining_wait(request, max_wait, started)
            try:
                request_id, future = await conn.submit(attempt)
                response = await self._wait(conn, request_id, future, attempt, overall)
            except _ConnectionLost as error:
                retry_until = retry_until or overall.earlier(self.timeout)
                if retry_until.expired:
                    return self._unavailable(limit, request, error)
                continue
            except SidecarUnavailable as error:
                return self._unavailable(limit, request, error)
            if isinstance(response, p.ErrorReply) and response.code == ErrorCode.SHUTTING_DOWN:
                conn.retired = True
                retry_until = retry_until or overall.earlier(self.timeout)
                continue
            granted = core.granted_or_raise(response, limit)
            return AsyncLease(
                self, conn, limit, granted, core.reservation(request.cost, granted.tokens)
            )

    def _unavailable(self, limit: str, request: p.Acquire, error: BaseException) -> AsyncLease:
        if not isinstance(error, SidecarUnavailable):
            error = core.unavailable(self.socket_path, error)
        if self.on_unavailable == "raise":
            raise error
        warnings.warn(
            f"ratekeeper: proceeding without a rate limit on {limit!r}: {core.describe(error)}",
            SidecarUnavailableWarning,
            stacklevel=3,
        )
        return AsyncLease(self, None, limit, None, core.reservation(request.cost, 0))

    @contextlib.asynccontextmanager
    async def reserve(
        self, limit: str, tokens: Optional[int] = None, **options: Any
    ) -> AsyncIterator[AsyncLease]:
        """`async with client.reserve(...) as lease:` — see `Client.reserve`."""
        lease = await self.acquire(limit, tokens, **options)
        async with lease:
            yield lease

    async def _finish(self, lease: AsyncLease, exc: Optional[BaseException]) -> None:
        if lease.settled:
            return
        if exc is None:
            await lease.settle_as_reserved()
            return
        try:
            await lease.release()
        except RatekeeperError as error:
            log.warning("could not release lease %s: %s", lease.lease_id, error)

    async def estimate(
        self,
        limit: str,
        tokens: Optional[int] = None,
        *,
        messages: Optional[Iterable[core.MessageLike]] = None,
        max_tokens: Optional[int] = None,
        tools: Any = None,
    ) -> p.Estimated:
        """What an acquire with that cost would reserve, reserving nothing."""
        cost = core.build_cost(tokens, messages, max_tokens, tools)
        return core.expect(await self._call(p.Estimate(limit, cost)), p.Estimated)

    async def status(self, limit: Optional[str] = None) -> p.StatusReply:
        """The store kind and the buckets of one limit, or of every limit."""
        return core.expect(await self._call(p.Status(limit)), p.StatusReply)

    async def ping(self) -> float:
        """Round trip to the daemon, in seconds (connecting first if needed)."""
        await self._connection(core.Deadline(self.timeout))
        started = time.perf_counter()
        core.expect(await self._call(p.Ping()), p.Pong)
        return time.perf_counter() - started

    async def close(self) -> None:
        """Closes the connection. The client can still be used: it reconnects."""
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if conn.alive:
            await conn.close()
        else:
            conn.abort()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.close()

    def __repr__(self) -> str:
        return (
            f"<ratekeeper.AsyncClient {self.socket_path!r} on_unavailable={self.on_unavailable!r}>"
        )
