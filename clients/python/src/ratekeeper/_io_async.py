"""What the asyncio client waits on: its connection, the slot that holds it, sleeping.

Every task sends on one pipelined connection under its own request id and
awaits a future; a reader task completes the futures as answers arrive, in any
order. The connection belongs to the event loop and the process that opened
it; for a different loop or a forked child the slot opens another.

`_io_sync` has the same names and signatures without `async`: the policy in
`_async.py` (and `_sync.py`, generated from it) is written against them once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Awaitable
from typing import Callable, Optional

from . import _core as core
from . import _protocol as p
from ._core import ConnectionLost
from ._errors import ProtocolError

log = logging.getLogger("ratekeeper")

#: What `Connection.submit` returns to wait on.
Future = asyncio.Future
#: What `Connection.wait` raises at its deadline (not the builtin before Python 3.11).
Timeout = asyncio.TimeoutError


async def sleep(seconds: float) -> None:
    """Suspends the calling task (`asyncio.sleep`, looked up at each call)."""
    await asyncio.sleep(seconds)


class Connection:
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
        self._waiters: dict[asyncio.Future, asyncio.Future] = {}  # the callers' own, by answer
        self._counted: set[int] = set()
        self._closed: Optional[ConnectionLost] = None
        #: Set when the daemon said ShuttingDown: new acquires go elsewhere.
        self.retired = False
        self._slots = asyncio.Semaphore(session.max_in_flight)
        self._drain_lock = asyncio.Lock()
        for frame in leftover:
            self._deliver(frame.request_id, frame.response)
        self._task = self.loop.create_task(self._read_loop())

    @classmethod
    async def open(cls, path: str, client_name: str, deadline: core.Deadline) -> Connection:
        """Connects to `path` and exchanges `Hello`, within `deadline` (at least 50 ms)."""
        remaining = deadline.remaining()
        try:
            return await asyncio.wait_for(
                cls._open(path, client_name), None if remaining is None else max(remaining, 0.05)
            )
        except asyncio.TimeoutError:  # not an OSError before Python 3.11
            raise TimeoutError("no answer to Hello within the deadline") from None

    @classmethod
    async def _open(cls, path: str, client_name: str) -> Connection:
        reader, writer = await asyncio.open_unix_connection(path, limit=core.RECV_SIZE)
        try:
            session = core.Session(client_name)
            hello_id, hello = session.hello_frame()
            writer.write(hello)
            leftover = None
            while leftover is None:
                data = await reader.read(core.RECV_SIZE)
                if not data:
                    raise ConnectionResetError("the daemon closed the connection during Hello")
                leftover = session.receive_hello(hello_id, data)
        except BaseException:
            writer.transport.abort()
            raise
        return cls(session, reader, writer, leftover)

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
        """Alive, and not retired: new requests may go on it."""
        return self.alive and not self.retired

    async def submit(
        self, request: core.AnyRequest, deadline: core.Deadline
    ) -> tuple[int, asyncio.Future]:
        """Sends `request`; the future completes with its answer or `ConnectionLost`.

        A task waits for one of the daemon's in-flight slots as long as it takes
        (`deadline` is not applied here: the wait for the answer bounds the call).
        """
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
            if self._writer.transport.get_write_buffer_size() > core.RECV_SIZE:
                async with self._drain_lock:
                    await self._writer.drain()
        except (OSError, RuntimeError) as error:
            self._fail(ConnectionLost(f"sending failed: {error}"))
        return request_id, future

    def send_and_forget(self, request: core.AnyRequest) -> None:
        """Sends a request whose answer nobody awaits (cancels, late releases)."""
        if self._closed is not None or self.pid != os.getpid():
            return
        _, data = self.session.request_frame(request)
        try:
            self._writer.write(data)
        except (OSError, RuntimeError) as error:
            log.debug("could not send %s: %s", type(request).__name__, error)

    async def wait(self, future: asyncio.Future, deadline: core.Deadline) -> p.Response:
        """The answer of `future`.

        Raises `Timeout` at the deadline and `ConnectionLost` when the
        connection broke; the future itself is never cancelled (a cancelled
        caller cancels only its own waiter, which the reader completes along
        with the future: one wake-up, where `wait_for(shield(...))` takes three).
        """
        if not future.done():
            waiter = self.loop.create_future()
            self._waiters[future] = waiter
            remaining = deadline.remaining()
            timer = None if remaining is None else self.loop.call_later(remaining, _expire, waiter)
            try:
                await waiter
            finally:
                del self._waiters[future]
                if timer is not None:
                    timer.cancel()
        return future.result()

    async def _read_loop(self) -> None:
        try:
            while True:
                data = await self._reader.read(core.RECV_SIZE)
                if not data:
                    reason = ConnectionLost("the daemon closed the connection")
                    break
                decoder = self.session.decoder
                decoder.receive_data(data)
                answer = decoder.next_answer()
                while answer is not p.NEED_DATA:
                    self._deliver(*answer)
                    answer = decoder.next_answer()
        except ProtocolError as error:
            log.error("closing the connection to the sidecar: %s", error)
            reason = ConnectionLost(f"protocol error: {error}")
        except OSError as error:
            reason = ConnectionLost(str(error))
        except asyncio.CancelledError:
            reason = ConnectionLost("the client was closed")
        self._fail(reason)
        self._writer.transport.abort()

    def _deliver(self, request_id: int, response: p.Response) -> None:
        if request_id == 0:
            core.connection_answer(response)
            return
        future = self._pending.pop(request_id, None)
        if request_id in self._counted:
            self._counted.discard(request_id)
            self._slots.release()
        if future is not None and not future.done():
            future.set_result(response)
            waiter = self._waiters.get(future)
            if waiter is not None and not waiter.done():
                waiter.set_result(None)

    def _fail(self, reason: ConnectionLost) -> None:
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
            waiter = self._waiters.get(future)
            if waiter is not None and not waiter.done():
                waiter.set_result(None)

    async def close(self) -> None:
        """Closes the connection; waiting calls fail with `SidecarUnavailable`."""
        self._fail(ConnectionLost("the client was closed"))
        self._task.cancel()
        self._writer.transport.abort()
        # The reader ends with the cancellation; a cancellation of our caller still propagates.
        await asyncio.gather(self._task, return_exceptions=True)

    def abort(self) -> None:
        """Drops the connection without awaiting (another loop, or a forked child)."""
        self._closed = self._closed or ConnectionLost("abandoned")
        if self.pid == os.getpid():
            with contextlib.suppress(Exception):
                self._writer.transport.abort()
        # In a forked child the transport is left alone: closing it would run
        # the parent's loop machinery; the descriptor goes when the child exits.


class Slot:
    """Holds a client's connection: one task opens the next one, for every caller.

    `owner` (the client) is not needed here: a connection ends with its loop.
    """

    def __init__(self, path: str, owner: object) -> None:
        self.path = path
        self.conn: Optional[Connection] = None
        #: Whether the last connect gave up on the sidecar (the policy's note).
        self.down = False
        self._connecting: Optional[asyncio.Task] = None

    def ready(self) -> Optional[Connection]:
        """The connection if it is usable now; otherwise `get` opens another."""
        conn = self.conn
        if conn is not None and conn.usable:
            return conn
        return None

    async def get(
        self, deadline: core.Deadline, connect: Callable[[core.Deadline], Awaitable[Connection]]
    ) -> Connection:
        """The usable connection, or a new one from `connect` (one task connects for all)."""
        conn = self.conn
        if conn is not None and conn.usable:
            return conn
        loop = asyncio.get_running_loop()
        if conn is not None and not conn.alive and conn.loop is not loop:
            conn.abort()  # opened on another loop or in the parent process
        connecting = self._connecting
        if connecting is None or connecting.done() or connecting.get_loop() is not loop:
            # One task connects, for every caller; cancelling a caller does not stop it.
            connecting = loop.create_task(self._connect_and_keep(connect, deadline))
            connecting.add_done_callback(_retrieve)
            self._connecting = connecting
        try:
            return await asyncio.wait_for(asyncio.shield(connecting), deadline.remaining())
        except asyncio.TimeoutError:
            raise core.unavailable(self.path, None) from None

    async def _connect_and_keep(
        self, connect: Callable[[core.Deadline], Awaitable[Connection]], deadline: core.Deadline
    ) -> Connection:
        conn = await connect(deadline)
        self.conn = conn
        return conn

    async def close(self) -> None:
        """Closes the connection: awaited on its own loop, dropped on any other."""
        conn, self.conn = self.conn, None
        if conn is None:
            return
        if conn.alive:
            await conn.close()
        else:
            conn.abort()


def _expire(waiter: asyncio.Future) -> None:
    """A waiter's deadline passed: its caller raises `Timeout`."""
    if not waiter.done():
        waiter.set_exception(Timeout())


def _retrieve(task: asyncio.Task) -> None:
    """Marks a connect task's failure as seen when no caller awaited it any more."""
    if not task.cancelled():
        task.exception()
