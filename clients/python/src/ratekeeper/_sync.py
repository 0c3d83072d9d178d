"""The blocking client: one pipelined connection per process, shared by threads.

Design: every thread of a process sends its requests on one Unix socket, each
under its own request id, and waits on a future. There is no background
thread: a waiting caller reads the socket while no other does (leader and
followers), completing every caller's future as answers arrive, in whatever
order the daemon sends them, and hands the reading over when its own answer
is in. A request that waits seconds for its reservation holds up nothing
behind it; a lone thread reads its answers itself, with no thread switch; a
process needs one connection (one file descriptor on the daemon) however many
threads it runs; and leases are settled on the connection that acquired them,
as PROTOCOL.md asks.

After `fork` the child never touches the parent's socket: a fork hook (and a
pid check on every call) drops the inherited connection without shutting it
down, and the child opens its own on first use.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import socket
import threading
import time
import warnings
import weakref
from collections.abc import Iterable, Iterator
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, Optional, Union

from . import _core as core
from . import _protocol as p
from ._errors import (
    ErrorCode,
    ProtocolError,
    RatekeeperError,
    SidecarUnavailable,
    TooManyInFlight,
    closes_connection,
)

log = logging.getLogger("ratekeeper")

_RECV_SIZE = 64 * 1024


class SidecarUnavailableWarning(RuntimeWarning):
    """Issued when a call proceeds unlimited because the sidecar is unreachable ("allow")."""


class _ConnectionLost(SidecarUnavailable):
    """The connection broke under a request; the call may retry on a new one."""


class _Connection:
    """One socket to the daemon that has exchanged `Hello`.

    No thread of its own: a caller waiting for an answer becomes the reader
    while nobody else reads, decodes whatever arrives and completes the
    futures of the other callers; when its own answer is in, it hands the
    reading over to a caller still waiting. One thread alone therefore reads
    its own answers without a thread switch, and many threads share one
    socket without mixing up answers.
    """

    def __init__(self, path: str, client_name: str, deadline: core.Deadline) -> None:
        self.pid = os.getpid()
        self.session = core.Session(client_name)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            remaining = deadline.remaining()
            sock.settimeout(None if remaining is None else max(remaining, 0.05))
            sock.connect(path)
            hello_id, hello = self.session.hello_frame()
            sock.sendall(hello)
            frames: list[p.ServerFrame] = []
            while not frames:
                data = sock.recv(_RECV_SIZE)
                if not data:
                    raise ConnectionResetError("the daemon closed the connection during Hello")
                frames = list(self.session.receive_data(data))
            if frames[0].request_id not in (hello_id, 0):
                raise ProtocolError(f"answer to request {frames[0].request_id} before Hello")
            self.session.accept_hello(frames[0])
            sock.settimeout(None)
        except BaseException:
            sock.close()
            raise
        self._sock = sock
        self._poll = select.poll()
        self._poll.register(sock, select.POLLIN)
        self._state = threading.Lock()  # guards everything below but the socket writes
        self._send = threading.Lock()  # one frame at a time on the socket
        self._pending: dict[int, Future] = {}
        self._closed: Optional[_ConnectionLost] = None
        self._reading = False  # whether a caller is the reader now
        self._sleepers: dict[threading.Event, Future] = {}  # callers waiting on the reader
        #: Set when the daemon said ShuttingDown: new acquires go elsewhere.
        self.retired = False
        self._slots = threading.BoundedSemaphore(self.session.max_in_flight)
        for frame in frames[1:]:
            self._deliver(frame)

    @property
    def usable(self) -> bool:
        return self._closed is None and not self.retired and self.pid == os.getpid()

    @property
    def alive(self) -> bool:
        """Not known to be closed, and owned by this process: leases can be settled on it."""
        return self._closed is None and self.pid == os.getpid()

    def submit(self, request: p.Request, deadline: core.Deadline) -> tuple[int, Future]:
        """Sends `request`; the future completes with its answer or `_ConnectionLost`."""
        counted = core.counts_in_flight(request)
        if counted and not self._slots.acquire(timeout=deadline.remaining()):
            raise TooManyInFlight(
                f"{self.session.max_in_flight} requests are already unanswered on this connection"
            )
        future: Future = Future()
        future.counted = counted  # type: ignore[attr-defined]
        with self._state:
            if self._closed is not None:
                if counted:
                    self._slots.release()
                raise self._closed
            request_id, data = self.session.request_frame(request)
            self._pending[request_id] = future
        try:
            with self._send:
                self._sock.sendall(data)
        except OSError as error:
            self._fail(_ConnectionLost(f"sending failed: {error}"))
        return request_id, future

    def send_and_forget(self, request: p.Request) -> None:
        """Sends a request whose answer nobody waits for (cancels, late releases).

        Its answer is read, and dropped, by whichever call reads next.
        """
        try:
            self.submit(request, core.Deadline(0))
        except RatekeeperError as error:
            log.debug("could not send %s: %s", type(request).__name__, error)

    def wait(self, future: Future, deadline: core.Deadline) -> p.Response:
        """The answer of `future`, reading the socket when no other caller does.

        Raises `FutureTimeout` at the deadline and `_ConnectionLost` when the
        connection broke.
        """
        wake = threading.Event()
        future.add_done_callback(lambda _: wake.set())
        while not future.done():
            if deadline.expired:
                raise FutureTimeout
            with self._state:
                reader = not self._reading and self._closed is None and not future.done()
                if reader:
                    self._reading = True
                elif not future.done():
                    self._sleepers[wake] = future
            if reader:
                try:
                    self._read_until(future, deadline)
                finally:
                    self._hand_over()
            else:
                wake.wait(deadline.remaining())
                with self._state:
                    self._sleepers.pop(wake, None)
                wake.clear()
        return future.result()

    def _read_until(self, future: Future, deadline: core.Deadline) -> None:
        try:
            while not future.done():
                remaining = deadline.remaining()
                if remaining is not None and not self._poll.poll(remaining * 1000):
                    return  # the deadline passed; the caller's loop raises
                data = self._sock.recv(_RECV_SIZE)
                if not data:
                    self._fail(_ConnectionLost("the daemon closed the connection"))
                    return
                for frame in self.session.receive_data(data):
                    self._deliver(frame)
        except ProtocolError as error:
            log.error("closing the connection to the sidecar: %s", error)
            self._fail(_ConnectionLost(f"protocol error: {error}"))
        except OSError as error:
            self._fail(_ConnectionLost(str(error)))

    def _hand_over(self) -> None:
        """Stops reading; wakes one caller still waiting so that it reads on."""
        with self._state:
            self._reading = False
            successor = next(
                (wake for wake, waiting in self._sleepers.items() if not waiting.done()), None
            )
        if successor is not None:
            successor.set()

    def _deliver(self, frame: p.ServerFrame) -> None:
        if frame.request_id == 0:
            response = frame.response
            if isinstance(response, p.ErrorReply) and closes_connection(response.code):
                raise response.exception()
            log.warning("the sidecar sent a connection-level answer: %r", response)
            return
        with self._state:
            future = self._pending.pop(frame.request_id, None)
        if future is None:
            return  # the answer to a request sent and forgotten
        if future.counted:  # type: ignore[attr-defined]
            self._slots.release()
        future.set_result(frame.response)

    def _fail(self, reason: _ConnectionLost) -> None:
        with self._state:
            if self._closed is not None:
                return
            self._closed = reason
            pending, self._pending = self._pending, {}
        for future in pending.values():
            if future.counted:  # type: ignore[attr-defined]
                self._slots.release()
            future.set_exception(reason)
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)  # wakes a reader blocked in recv
        self._sock.close()

    def close(self) -> None:
        """Closes the connection; waiting calls fail with `SidecarUnavailable`."""
        self._fail(_ConnectionLost("the client was closed"))

    def forget(self) -> None:
        """In a forked child: drop this process's copy of the parent's socket.

        Only the file descriptor is closed; a shutdown would cut the parent off.
        """
        with contextlib.suppress(OSError):
            self._sock.close()


class _Slot:
    """Holds a client's connection, so a finalizer can close it without the client."""

    __slots__ = ("conn",)

    def __init__(self) -> None:
        self.conn: Optional[_Connection] = None


def _close_slot(slot: _Slot, pid: int) -> None:
    conn, slot.conn = slot.conn, None
    if conn is not None and conn.pid == os.getpid() == pid:
        conn.close()


_clients: weakref.WeakSet = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for client in list(_clients):
        client._reset_after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class Lease(core.LeaseBase):
    """A reservation granted by the daemon. Settle it once: `report` or `release`.

    A lease is settled on the connection that acquired it. If that connection
    is gone (the sidecar restarted), the daemon has already forgotten the lease
    and kept its reservation; settling it then does nothing and returns None.
    """

    def __init__(self, client: Client, conn: Optional[_Connection], *args: Any) -> None:
        super().__init__(*args)
        self._client = client
        self._conn = conn

    def report(
        self,
        used: Optional[int] = None,
        *,
        input_tokens: Optional[int] = None,
        output_tokens: Optional[int] = None,
    ) -> Optional[int]:
        """Settles the lease with the provider's usage: `report(total)` or by side.

        Returns the tokens given back (negative when the usage exceeded the
        reservation and the overrun was debited), or None when nothing was sent.
        """
        counts = core.report_counts(used, input_tokens, output_tokens)
        return self._settle(p.Report(self.lease_id or 0, *counts), p.Settled)

    def release(self) -> Optional[int]:
        """Gives the whole reservation back: the provider was never called."""
        return self._settle(p.Release(self.lease_id or 0), p.Released)

    def settle_as_reserved(self) -> Optional[int]:
        """Reports exactly what was reserved: keeps the reservation, closes the lease."""
        reserved = self.reserved
        return self.report(input_tokens=reserved.input_tokens, output_tokens=reserved.output_tokens)

    def _settle(self, request: p.Request, kind: type) -> Optional[int]:
        if self.unlimited:
            self.settled = True
            return None
        conn = self._conn
        if conn is None or not conn.alive:
            self.settled = True
            log.info("lease %s was lost with its connection; the daemon kept it", self.lease_id)
            return None
        try:
            response = self._client._request_on(conn, request)
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

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self._client._finish(self, exc)


class Client:
    """A thread-safe, fork-safe connection to the ratekeeper sidecar.

    `socket` defaults to RATEKEEPER_SOCKET, else /tmp/ratekeeper.sock.
    `timeout` (seconds) bounds what a call spends beyond its own `max_wait`:
    connecting, reconnecting after the sidecar restarted, and waiting for an
    answer that is not held back. `on_unavailable` says what `acquire` does when
    the sidecar cannot be reached within that time: `"raise"` raises
    `SidecarUnavailable`; `"allow"` warns and returns an unlimited no-op lease,
    so the application keeps working without a shared limit.

    After one call gave up on an unreachable sidecar, later calls try to
    connect once and fail at once, until the sidecar answers again.
    """

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
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._slot = _Slot()
        self._down = False
        self._finalizer = weakref.finalize(self, _close_slot, self._slot, self._pid)
        _clients.add(self)

    # -- connections --------------------------------------------------------

    def _reset_after_fork(self) -> None:
        conn, self._slot.conn = self._slot.conn, None
        if conn is not None and conn.pid != os.getpid():
            conn.forget()
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._down = False

    def _connection(self, deadline: core.Deadline) -> _Connection:
        if self._pid != os.getpid():
            self._reset_after_fork()
        conn = self._slot.conn
        if conn is not None and conn.usable:
            return conn
        if not self._lock.acquire(timeout=-1 if deadline.at is None else deadline.remaining()):
            raise core.unavailable(self.socket_path, TimeoutError("another thread is connecting"))
        try:
            conn = self._slot.conn
            if conn is not None and conn.usable:
                return conn
            conn = self._connect(deadline)
            self._slot.conn = conn
            return conn
        finally:
            self._lock.release()

    def _connect(self, deadline: core.Deadline) -> _Connection:
        name = self.name or core.default_client_name()
        last: Optional[BaseException] = None
        for delay in core.reconnect_delays():
            try:
                conn = _Connection(self.socket_path, name, deadline)
            except (OSError, _ConnectionLost) as error:
                last = error
            else:
                if self._down:
                    log.warning("the ratekeeper sidecar at %s is reachable again", self.socket_path)
                self._down = False
                return conn
            remaining = deadline.remaining()
            if self._down or remaining == 0:
                break
            time.sleep(delay if remaining is None else min(delay, remaining))
        if not self._down:
            log.warning("the ratekeeper sidecar at %s is unavailable: %s", self.socket_path, last)
        self._down = True
        raise core.unavailable(self.socket_path, last)

    def _wait(
        self,
        conn: _Connection,
        request_id: int,
        future: Future,
        request: p.Request,
        deadline: core.Deadline,
    ) -> p.Response:
        try:
            return conn.wait(future, deadline)
        except FutureTimeout:
            self._abandon(conn, request_id, future, request)
            raise SidecarUnavailable(
                f"no answer from the sidecar within {self.timeout}s of the deadline"
            ) from None
        except _ConnectionLost:
            raise
        except BaseException:  # KeyboardInterrupt and the like: the answer will come
            self._abandon(conn, request_id, future, request)
            raise

    @staticmethod
    def _abandon(conn: _Connection, request_id: int, future: Future, request: p.Request) -> None:
        """Cancels an acquire nobody waits for any more; releases it if granted anyway."""
        if not isinstance(request, p.Acquire):
            return
        conn.send_and_forget(p.Cancel(request_id))

        def release_late_grant(done: Future) -> None:
            if done.exception() is None and isinstance(done.result(), p.Granted):
                conn.send_and_forget(p.Release(done.result().lease))

        future.add_done_callback(release_late_grant)

    def _request_on(self, conn: _Connection, request: p.Request) -> p.Response:
        """One request on a given connection (a lease's), without reconnecting."""
        deadline = core.Deadline(self.timeout)
        request_id, future = conn.submit(request, deadline)
        return self._wait(conn, request_id, future, request, deadline)

    def _call(self, request: p.Request) -> p.Response:
        """A request that may be resent on a new connection if the old one broke."""
        deadline = core.Deadline(self.timeout)
        while True:
            conn = self._connection(deadline)
            try:
                return self._request_on(conn, request)
            except _ConnectionLost:
                if deadline.expired:
                    raise

    # -- the API ------------------------------------------------------------

    def acquire(
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
    ) -> Lease:
        """Reserves tokens in `limit`, waiting up to `max_wait` seconds for them.

        Give `tokens` (the prompt's tokens, or your whole estimate) and optionally
        `max_tokens` (output tokens to reserve on top), or the chat `messages`
        (and `tools`) for the daemon to count. `max_wait=None` uses the priority
        class's default wait; `0` means only if grantable now. Returns a granted
        `Lease`; raises `RateLimited` (with `retry_after`) when the wait would be
        longer, and the mapped exception for any other answer.
        """
        request = core.build_acquire(
            limit, tokens, messages, max_tokens, tools, tenant, priority, max_wait
        )
        started = time.monotonic()
        overall = core.Deadline(None if max_wait is None else max_wait + self.timeout)
        retry_until: Optional[core.Deadline] = None  # set when a connection first breaks
        while True:
            try:
                conn = self._connection(retry_until or overall.earlier(self.timeout))
            except SidecarUnavailable as error:
                return self._unavailable(limit, request, error)
            attempt = core.with_remaining_wait(request, max_wait, started)
            try:
                request_id, future = conn.submit(attempt, overall)
                response = self._wait(conn, request_id, future, attempt, overall)
            except _ConnectionLost as error:
                retry_until = retry_until or overall.earlier(self.timeout)
                if retry_until.expired:
                    return self._unavailable(limit, request, error)
                continue
            except SidecarUnavailable as error:  # alive but silent past the deadline
                return self._unavailable(limit, request, error)
            if isinstance(response, p.ErrorReply) and response.code == ErrorCode.SHUTTING_DOWN:
                # This daemon is draining: ask its successor, within the deadline.
                conn.retired = True
                retry_until = retry_until or overall.earlier(self.timeout)
                continue
            granted = core.granted_or_raise(response, limit)
            return Lease(self, conn, limit, granted, core.reservation(request.cost, granted.tokens))

    def _unavailable(self, limit: str, request: p.Acquire, error: SidecarUnavailable) -> Lease:
        if self.on_unavailable == "raise":
            raise error
        warnings.warn(
            f"ratekeeper: proceeding without a rate limit on {limit!r}: {core.describe(error)}",
            SidecarUnavailableWarning,
            stacklevel=3,
        )
        return Lease(self, None, limit, None, core.reservation(request.cost, 0))

    @contextlib.contextmanager
    def reserve(self, limit: str, tokens: Optional[int] = None, **options: Any) -> Iterator[Lease]:
        """`acquire` as a context manager: `with client.reserve(...) as lease:`.

        If the body raises before the lease was settled, the reservation is
        released (the provider call is assumed not to have happened). If the
        body ends normally without a report, the reservation is kept and the
        lease is settled as fully used: tokens are never handed back on a guess.
        """
        lease = self.acquire(limit, tokens, **options)
        with lease:
            yield lease

    def _finish(self, lease: Lease, exc: Optional[BaseException]) -> None:
        if lease.settled:
            return
        if exc is None:
            lease.settle_as_reserved()
            return
        try:
            lease.release()
        except RatekeeperError as error:
            log.warning("could not release lease %s: %s", lease.lease_id, error)

    def estimate(
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
        return core.expect(self._call(p.Estimate(limit, cost)), p.Estimated)

    def status(self, limit: Optional[str] = None) -> p.StatusReply:
        """The store kind and the buckets of one limit, or of every limit."""
        return core.expect(self._call(p.Status(limit)), p.StatusReply)

    def ping(self) -> float:
        """Round trip to the daemon, in seconds (connecting first if needed)."""
        self._connection(core.Deadline(self.timeout))
        started = time.perf_counter()
        core.expect(self._call(p.Ping()), p.Pong)
        return time.perf_counter() - started

    def close(self) -> None:
        """Closes the connection. The client can still be used: it reconnects."""
        conn, self._slot.conn = self._slot.conn, None
        if conn is not None and conn.pid == os.getpid():
            conn.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<ratekeeper.Client {self.socket_path!r} on_unavailable={self.on_unavailable!r}>"
