"""What the asyncio client waits on: its connection, the slot that holds it, sleeping.

Every task sends on one pipelined connection under its own request id and
awaits a waiter; the event loop's reading callback (a `BufferedProtocol`
receiving into the session's decoder) completes the answers' futures and
their waiters as answers arrive, in any order, without a reader task. The
connection belongs to the event loop and the process that opened it; for a
different loop or a forked child the slot opens another. As in `_sync/slot.py`,
a fork hook (and a pid check on every call) drops the inherited connection in
the child and closes the child's copy of its descriptor, never the parent's.

Written by hand, as is `_sync/transport.py`, which has the same names and
signatures without `async`: the rest of this package (and of `_sync`,
generated from it) is written against them once.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import socket
import weakref
from collections.abc import Awaitable
from typing import Callable, Optional

from .. import _proto as p
from .._core.connecting import check_peer
from .._core.deadlines import Deadline
from .._core.errors import ConnectionLost, unavailable
from .._core.requests import AnyRequest
from .._core.session import NOT_COUNTED, Session, connection_answer, deliver_answers

log = logging.getLogger("ratekeeper")

#: Whether this client's calls are awaited: `limit` decorates coroutine functions only.
COROUTINES = True

NEED_DATA = p.NEED_DATA

#: What `Connection.submit` returns to wait on.
Future = asyncio.Future
#: What `Connection.wait` raises at its deadline (not the builtin before Python 3.11).
Timeout = asyncio.TimeoutError

#: What `Connection.call` hands a request to when its caller leaves before the
#: answer: `abandon(connection, request_id, future)`.
Abandon = Callable[["Connection", int, asyncio.Future], None]


async def sleep(seconds: float) -> None:
    """Suspends the calling task (`asyncio.sleep`, looked up at each call)."""
    await asyncio.sleep(seconds)


class _Protocol(asyncio.BufferedProtocol):
    """Receives into the session's decoder and hands every answer to the connection.

    The event loop's reading callback decodes and completes the callers'
    waiters itself: no reader task, no stream buffer in between.
    """

    def __init__(self, session: Session, hello_id: int) -> None:
        self.session = session
        self.hello_id = hello_id
        #: The frames after the answer to `Hello`, once it is in (or the error).
        self.hello: asyncio.Future = asyncio.get_running_loop().create_future()
        self.conn: Optional[Connection] = None
        self.transport: Optional[asyncio.Transport] = None
        #: Set while the transport's write buffer is full: senders await it.
        self.drained: Optional[asyncio.Future] = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.session.decoder.get_buffer()

    def buffer_updated(self, nbytes: int) -> None:
        self.session.decoder.buffer_updated(nbytes)
        if self.conn is not None:
            self.conn._received()
            return
        if self.hello.done():
            return  # kept in the decoder until the connection takes over
        try:
            leftover = self.session.hello_answer(self.hello_id)
        except Exception as error:
            if not self.hello.done():
                self.hello.set_exception(error)
            self.transport.abort()  # type: ignore[union-attr]
            return
        if leftover is not None and not self.hello.done():
            self.hello.set_result(leftover)

    def eof_received(self) -> bool:
        return False  # the transport closes; connection_lost follows

    def connection_lost(self, exc: Optional[Exception]) -> None:
        reason = f"the daemon closed the connection{f': {exc}' if exc else ''}"
        if self.conn is not None:
            self.conn._fail(ConnectionLost(reason))
        elif not self.hello.done():
            self.hello.set_exception(ConnectionResetError(f"{reason} during Hello"))
        self.resume_writing()

    def pause_writing(self) -> None:
        if self.drained is None:
            self.drained = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        drained, self.drained = self.drained, None
        if drained is not None and not drained.done():
            drained.set_result(None)


class Connection:
    """One asyncio transport to the daemon that has exchanged `Hello`."""

    def __init__(
        self,
        session: Session,
        transport: asyncio.Transport,
        protocol: _Protocol,
        leftover: list[p.ServerFrame],
        sock: socket.socket,
    ) -> None:
        self.pid = os.getpid()
        self.loop = asyncio.get_running_loop()
        self.session = session
        self._transport = transport
        self._sock = sock  # the transport's own, kept for `forget` in a forked child
        self._protocol = protocol
        self._pending: dict[int, asyncio.Future] = {}
        self._waiters: dict[asyncio.Future, asyncio.Future] = {}  # the callers' own, by answer
        self._counted: set[int] = set()
        self._closed: Optional[ConnectionLost] = None
        #: Set when the daemon said ShuttingDown: new acquires go elsewhere.
        self.retired = False
        #: Cleared when the daemon answered a `UsageReport` as unsupported (it
        #: predates revision 6): the lease reports on it go as `Report`.
        self.usage_reports = True
        self._in_flight = 0  # unanswered requests that count against the daemon's bound
        self._room: collections.deque[asyncio.Future] = collections.deque()  # tasks waiting
        for frame in leftover:
            self._deliver(frame.request_id, frame.response)
        protocol.conn = self
        if session.decoder.buffered:
            self._received()

    @classmethod
    async def open(
        cls,
        path: str,
        client_name: str,
        deadline: Deadline,
        expected_uid: Optional[int] = None,
    ) -> Connection:
        """Connects to `path` and exchanges `Hello`, within `deadline` (at least
        50 ms), once the peer is known to run as `expected_uid` (when given)."""
        remaining = deadline.remaining()
        try:
            return await asyncio.wait_for(
                cls._open(path, client_name, expected_uid),
                None if remaining is None else max(remaining, 0.05),
            )
        except asyncio.TimeoutError:  # not an OSError before Python 3.11
            raise TimeoutError("no answer to Hello within the deadline") from None

    @classmethod
    async def _open(cls, path: str, client_name: str, expected_uid: Optional[int]) -> Connection:
        session = Session(client_name)
        hello_id, hello = session.hello_frame()
        loop = asyncio.get_running_loop()
        # What `create_unix_connection(path=...)` does, but holding the socket
        # object itself: only with it can a forked child drop its descriptor.
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.setblocking(False)
            await loop.sock_connect(sock, path)
            check_peer(sock, path, expected_uid)
            transport, protocol = await loop.create_unix_connection(
                lambda: _Protocol(session, hello_id), sock=sock
            )
        except BaseException:
            sock.close()
            raise
        try:
            transport.write(hello)
            leftover = await protocol.hello
        except BaseException:
            transport.abort()
            raise
        return cls(session, transport, protocol, leftover, sock)

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

    async def submit(self, request: AnyRequest, deadline: Deadline) -> tuple[int, asyncio.Future]:
        """Sends `request`; the future completes with its answer or `ConnectionLost`.

        A task waits for one of the daemon's in-flight slots as long as it takes
        (`deadline` is not applied here: the wait for the answer bounds the call).
        """
        counted = type(request) not in NOT_COUNTED
        if counted:
            while self._in_flight >= self.session.max_in_flight and self._closed is None:
                room = self.loop.create_future()
                self._room.append(room)
                try:
                    await room
                finally:
                    with contextlib.suppress(ValueError):
                        self._room.remove(room)
        if self._closed is not None:
            raise self._closed
        request_id, data = self.session.request_frame(request)
        future = self.loop.create_future()
        self._pending[request_id] = future
        if counted:
            self._in_flight += 1
            self._counted.add(request_id)
        self._transport.write(data)
        drained = self._protocol.drained
        if drained is not None:  # the write buffer is full: wait until it drains
            await asyncio.shield(drained)
        return request_id, future

    async def call(
        self,
        request: AnyRequest,
        deadline: Deadline,
        abandon: Optional[Abandon] = None,
    ) -> p.Response:
        """Sends `request` and returns its answer: `submit`, then `wait`.

        A caller that leaves before the answer (its deadline passed, it was
        cancelled) hands the request to `abandon(self, request_id, future)`
        first, unless the connection broke (`ConnectionLost`).
        """
        request_id, future = await self.submit(request, deadline)
        try:
            return await self.wait(future, deadline)
        except ConnectionLost:
            raise
        except BaseException:
            if abandon is not None:
                abandon(self, request_id, future)
            raise

    def send_and_forget(self, request: AnyRequest) -> None:
        """Sends a request whose answer nobody awaits (cancels, late releases)."""
        if self._closed is not None or self.pid != os.getpid():
            return
        _, data = self.session.request_frame(request)
        self._transport.write(data)

    async def wait(self, future: asyncio.Future, deadline: Deadline) -> p.Response:
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

    def _received(self) -> None:
        """Called by the protocol with new bytes in the decoder: delivers every whole answer."""
        lost = deliver_answers(self.session.decoder, self._deliver)
        if lost is not None:
            self._fail(lost)
            self._transport.abort()

    def _deliver(self, request_id: int, response: p.Response) -> None:
        if request_id == 0:
            connection_answer(response)
            return
        future = self._pending.pop(request_id, None)
        if request_id in self._counted:
            self._counted.discard(request_id)
            self._in_flight -= 1
            if self._room:
                _wake(self._room[0])
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
        self._counted.clear()
        self._in_flight = 0
        for room in self._room:
            _wake(room)
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
        self._transport.abort()

    def abort(self) -> None:
        """Drops the connection without awaiting (another loop, or a forked child)."""
        self._closed = self._closed or ConnectionLost("abandoned")
        if self.pid == os.getpid():
            with contextlib.suppress(Exception):
                self._transport.abort()
        else:
            self.forget()

    def forget(self) -> None:
        """In a forked child: drop this process's copy of the parent's socket.

        Only the child's descriptor is closed. The transport is left alone
        (closing it would run the parent's loop machinery), and a shutdown
        would cut the parent off. The socket object is detached first, so the
        transport, if the child ever collects it, closes nothing: not a
        descriptor number the child has reused since.
        """
        self._closed = self._closed or ConnectionLost("inherited from the parent process")
        with contextlib.suppress(OSError):
            fd = self._sock.detach()
            if fd >= 0:
                os.close(fd)


#: Every live slot, for the fork hook.
_slots: weakref.WeakSet = weakref.WeakSet()


class Slot:
    """Holds a client's connection: one task opens the next one, for every caller.

    `owner` (the client) is not needed here: a connection ends with its loop.
    In a forked child the connection is dropped and its descriptor closed.
    """

    def __init__(self, path: str, owner: object) -> None:
        self.path = path
        self.conn: Optional[Connection] = None
        #: Whether the last connect gave up on the sidecar (the policy's note).
        self.down = False
        self._connecting: Optional[asyncio.Task] = None
        self._pid = os.getpid()
        _slots.add(self)

    @property
    def reconnecting(self) -> bool:
        """Whether this loop's connection broke or was retired: its daemon may be restarting."""
        conn = self.conn
        if conn is None or conn.pid != os.getpid() or conn.usable:
            return False
        try:
            return conn.loop is asyncio.get_running_loop()
        except RuntimeError:
            return False

    def ready(self) -> Optional[Connection]:
        """The connection if it is usable now; otherwise `get` opens another."""
        conn = self.conn
        if conn is not None and conn.usable:
            return conn
        return None

    async def get(
        self, deadline: Deadline, connect: Callable[[Deadline], Awaitable[Connection]]
    ) -> Connection:
        """The usable connection, or a new one from `connect` (one task connects for all)."""
        if self._pid != os.getpid():
            self._reset_after_fork()
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
            raise unavailable(self.path, None) from None

    async def _connect_and_keep(
        self, connect: Callable[[Deadline], Awaitable[Connection]], deadline: Deadline
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

    def _reset_after_fork(self) -> None:
        conn, self.conn = self.conn, None
        if conn is not None and conn.pid != os.getpid():
            conn.forget()
        self._connecting = None  # a task of the parent's loop
        self._pid = os.getpid()
        self.down = False


def _after_fork_in_child() -> None:
    for slot in list(_slots):
        slot._reset_after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _wake(room: asyncio.Future) -> None:
    """Lets a task waiting for an in-flight slot look again."""
    if not room.done():
        room.set_result(None)


def _expire(waiter: asyncio.Future) -> None:
    """A waiter's deadline passed: its caller raises `Timeout`."""
    if not waiter.done():
        waiter.set_exception(Timeout())


def _retrieve(task: asyncio.Task) -> None:
    """Marks a connect task's failure as seen when no caller awaited it any more."""
    if not task.cancelled():
        task.exception()
