"""What the blocking client waits on: its connection, the slot that holds it, sleeping.

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

After `fork` the child never touches the parent's socket (`slot.py`).

Written by hand, as is `_async/transport.py`, which has the same names and
signatures with `async`: the rest of this package, generated from `_async`,
is written against them once.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import socket
import threading
import time
from collections.abc import Iterable
from typing import Callable, Optional

from .. import _proto as p
from .._core.connecting import check_peer
from .._core.deadlines import Deadline
from .._core.errors import ConnectionLost
from .._core.requests import AnyRequest
from .._core.session import NOT_COUNTED, Session, connection_answer
from .._proto.errors import ProtocolError, RatekeeperError, TooManyInFlight
from .slot import Slot as Slot  # the policy takes it from here, as from `_async/transport.py`

log = logging.getLogger("ratekeeper")

#: Whether this client's calls are awaited: `limit` decorates plain functions only.
COROUTINES = False

NEED_DATA = p.NEED_DATA

#: Bytes asked of the socket per read.
RECV_SIZE = 64 * 1024

#: What `Connection.wait` raises at its deadline.
Timeout = TimeoutError

#: What `Connection.call` hands a request to when its caller leaves before the
#: answer: `abandon(connection, request_id, future)`.
Abandon = Callable[["Connection", int, "Future"], None]

#: An id no answer carries (ids are unsigned): `_read` delivers every answer.
NO_ID = -1

#: Longest a reader waits in `poll` before it looks at its deadline (and at
#: whether the connection was closed under it) again.
RECV_TICK = 0.25


def sleep(seconds: float) -> None:
    """Blocks the calling thread (`time.sleep`, looked up at each call)."""
    time.sleep(seconds)


class Wake:
    """What a caller waiting for the reader sleeps on: a bare lock, held while
    nothing happened and released to wake it. (A `threading.Event` is a
    condition written in Python: a lock allocated, queued and dequeued per
    wait, two more lock sections per wake.) A wake nobody waits for is kept
    for the next `wait`; a second one before it is the same wake."""

    __slots__ = ("_lock",)

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lock.acquire()

    def set(self) -> None:
        # Not contextlib.suppress: this runs once per answer handed over.
        try:  # noqa: SIM105
            self._lock.release()
        except RuntimeError:
            pass  # already set, not yet taken

    def wait(self, timeout: Optional[float]) -> bool:
        """Until woken (True) or `timeout` seconds (None: no limit) passed."""
        if timeout is None:
            return self._lock.acquire()
        return self._lock.acquire(timeout=min(timeout, threading.TIMEOUT_MAX))

    def clear(self) -> None:
        """Forgets a wake that came after the wait ended."""
        self._lock.acquire(blocking=False)


class Future:
    """The answer to one request, as the blocking connection delivers it.

    A few slots rather than `concurrent.futures.Future` (a condition and a
    lock of its own each): the connection completes it under its lock, and a
    caller gets a `Wake` to sleep on only when another thread is reading.
    The methods are those of `asyncio.Future` that the policy uses.
    """

    __slots__ = ("_callbacks", "_done", "_error", "_lock", "_result", "_wake", "counted")

    def __init__(self, lock: threading.Lock, counted: bool) -> None:
        self._lock = lock  # the connection's
        #: Whether the request holds one of the daemon's in-flight slots.
        self.counted = counted
        self._done = False
        self._result: Optional[p.Response] = None
        self._error: Optional[BaseException] = None
        self._wake: Optional[Wake] = None
        self._callbacks: Optional[list[Callable[[Future], None]]] = None

    def done(self) -> bool:
        return self._done

    def cancelled(self) -> bool:
        return False

    def result(self) -> p.Response:
        if self._error is not None:
            raise self._error
        return self._result  # type: ignore[return-value]

    def exception(self) -> Optional[BaseException]:
        return self._error

    def add_done_callback(self, callback: Callable[[Future], None]) -> None:
        """Calls `callback(self)` once the answer is in (at once if it is)."""
        with self._lock:
            if not self._done:
                self._callbacks = [*(self._callbacks or ()), callback]
                return
        callback(self)

    def _completed(self) -> None:
        """After the connection completed it (its lock released): wakes and calls back."""
        if self._wake is not None:
            self._wake.set()
        for callback in self._callbacks or ():
            try:
                callback(self)
            except Exception:
                log.exception("a callback of request failed")


class Connection:
    """One socket to the daemon that has exchanged `Hello`.

    No thread of its own: a caller waiting for an answer becomes the reader
    while nobody else reads, decodes whatever arrives and completes the
    futures of the other callers; when its own answer is in, it hands the
    reading over to a caller still waiting. One thread alone therefore sends
    its request and reads its answer itself, with one `sendall` and one
    `poll` + `recv_into`, no thread switch and nothing to wake; many threads
    share one socket without mixing up answers.
    """

    def __init__(
        self, session: Session, sock: socket.socket, leftover: list[p.ServerFrame]
    ) -> None:
        self.pid = os.getpid()
        self.session = session
        self._sock = sock
        self._poll = select.poll()
        self._poll.register(sock, select.POLLIN)
        self._state = threading.Lock()  # guards everything below but the socket writes
        self._send = threading.Lock()  # one frame at a time on the socket
        self._pending: dict[int, Future] = {}
        self._closed: Optional[ConnectionLost] = None
        self._reading = False  # whether a caller is the reader now
        self._sleepers: dict[Future, None] = {}  # callers waiting on the reader, in order
        #: Set when the daemon said ShuttingDown: new acquires go elsewhere.
        self.retired = False
        #: Cleared when the daemon answered a `UsageReport` as unsupported (it
        #: predates revision 6): the lease reports on it go as `Report`.
        self.usage_reports = True
        self._in_flight = 0  # unanswered requests that count against the daemon's bound
        self._room = threading.Condition(self._state)  # notified when one of those is answered
        self._room_waiters = 0
        self._deliver_all((frame.request_id, frame.response) for frame in leftover)

    @classmethod
    def open(
        cls,
        path: str,
        client_name: str,
        deadline: Deadline,
        expected_uid: Optional[int] = None,
    ) -> Connection:
        """Connects to `path` and exchanges `Hello`, within `deadline` (at least
        50 ms), once the peer is known to run as `expected_uid` (when given)."""
        session = Session(client_name)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            remaining = deadline.remaining()
            sock.settimeout(None if remaining is None else max(remaining, 0.05))
            sock.connect(path)
            check_peer(sock, path, expected_uid)
            hello_id, hello = session.hello_frame()
            sock.sendall(hello)
            leftover = None
            while leftover is None:
                data = sock.recv(RECV_SIZE)
                if not data:
                    raise ConnectionResetError("the daemon closed the connection during Hello")
                leftover = session.receive_hello(hello_id, data)
            sock.settimeout(None)
        except BaseException:
            sock.close()
            raise
        return cls(session, sock, leftover)

    @property
    def alive(self) -> bool:
        """Not known to be closed, and owned by this process: leases can be settled on it."""
        return self._closed is None and self.pid == os.getpid()

    @property
    def usable(self) -> bool:
        """Alive, and not retired: new requests may go on it."""
        return self._closed is None and not self.retired and self.pid == os.getpid()

    def submit(self, request: AnyRequest, deadline: Deadline) -> tuple[int, Future]:
        """Sends `request`; the future completes with its answer or `ConnectionLost`.

        Waits until `deadline` for one of the daemon's in-flight slots, then
        raises `TooManyInFlight`.
        """
        counted = type(request) not in NOT_COUNTED
        future = Future(self._state, counted)
        with self._state:
            if self._closed is not None:
                raise self._closed
            if counted and self._in_flight >= self.session.max_in_flight:
                self._wait_for_room(deadline)
            request_id, data = self.session.request_frame(request)
            self._pending[request_id] = future
            if counted:
                self._in_flight += 1
        try:
            with self._send:
                self._sock.sendall(data)
        except OSError as error:
            self._fail(ConnectionLost(f"sending failed: {error}"))
        return request_id, future

    def call(
        self,
        request: AnyRequest,
        deadline: Deadline,
        abandon: Optional[Abandon] = None,
    ) -> p.Response:
        """Sends `request` and returns its answer: `submit` and `wait` in one.

        A caller alone on the connection (nobody reading, no other request
        unanswered, room in the daemon's bound) becomes the reader before it
        sends, so its answer can only come to itself: it needs no future,
        takes the lock once to send and once to finish, and picks its answer
        out of the stream as it reads. Otherwise it submits and waits like
        any other: while others' answers are due, a caller that took the
        reading back at once would wake their next reader for nothing (with
        8 threads a process, 4 processes on 2 cores: 0.85x the acquires/s). A caller that
        leaves before the answer (the deadline passed: `Timeout`; or an
        exception such as KeyboardInterrupt) hands the request to
        `abandon(self, request_id, future)` first, unless the connection
        broke (`ConnectionLost`).
        """
        counted = type(request) not in NOT_COUNTED
        with self._state:
            alone = not self._reading and not self._pending and self._closed is None
            if alone and counted and self._in_flight >= self.session.max_in_flight:
                alone = False
            if alone:
                request_id, data = self.session.request_frame(request)
                self._reading = True
                if counted:
                    self._in_flight += 1
        if not alone:
            request_id, future = self.submit(request, deadline)
            try:
                return self.wait(future, deadline)
            except ConnectionLost:
                raise
            except BaseException:
                if abandon is not None:
                    abandon(self, request_id, future)
                raise
        answered = False
        try:
            try:
                with self._send:
                    self._sock.sendall(data)
            except OSError as error:
                self._fail(ConnectionLost(f"sending failed: {error}"))
                raise self._closed from None  # type: ignore[misc]
            response = self._read(deadline, request_id, None)
            if response is None:
                raise Timeout if self._closed is None else self._closed
            answered = True
            return response
        except ConnectionLost:
            raise
        except BaseException:
            future = self._expect(request_id, counted)
            if abandon is not None:
                abandon(self, request_id, future)
            raise
        finally:
            self._stop_reading(counted and answered)

    def _read(
        self, deadline: Deadline, own_id: int, future: Optional[Future]
    ) -> Optional[p.Response]:
        """The reader's loop: reads and delivers answers until `future` is done,
        or, with no future (a request `call` sent alone), until the answer to
        `own_id` is in, which it returns instead of delivering.

        Returns None at the deadline and when the connection failed (then
        `_closed` says why, and every future has it). The reader waits in
        `poll`, at most a tick at a time, and reads only what is there: a
        thread blocked in `recv` on a Unix socket is woken (for nothing) each
        time the daemon reads a request of that socket, since the kernel
        wakes every sleeper of the socket when its send buffer drains, while
        `poll` waits for incoming data alone. That saves a context switch per
        round trip, in the daemon (which wakes) and in the client.
        """
        decoder = self.session.decoder
        sock = self._sock
        at = deadline.at
        deliver_all = self._deliver_all
        poll = self._poll.poll
        while future is None or not future._done:
            wait = RECV_TICK
            if at is not None:
                wait = min(wait, at - time.monotonic())
            if not poll(max(0.0, wait) * 1000):
                if at is not None and time.monotonic() >= at:
                    return None  # the deadline passed
                continue
            try:
                received = sock.recv_into(decoder.get_buffer())
            except OSError as error:
                self._fail(ConnectionLost(str(error)))
                return None
            if not received:
                self._fail(ConnectionLost("the daemon closed the connection"))
                return None
            decoder.buffer_updated(received)
            own = None
            others: list[tuple[int, p.Response]] = []
            try:
                answer = decoder.next_answer()
                while answer is not NEED_DATA:
                    if answer[0] == own_id:
                        own = answer[1]
                    else:
                        others.append(answer)
                    answer = decoder.next_answer()
            except ProtocolError as error:
                deliver_all(others)
                log.error("closing the connection to the sidecar: %s", error)
                self._fail(ConnectionLost(f"protocol error: {error}"))
                return own
            if others:
                deliver_all(others)
            if own is not None:
                return own
        return None

    def _expect(self, request_id: int, counted: bool) -> Future:
        """The future of a request `call` sent alone and left before its answer,
        for whichever caller reads next to complete."""
        future = Future(self._state, counted)
        with self._state:
            if self._closed is None:
                self._pending[request_id] = future
                return future
            future._error = self._closed
            future._done = True
        return future

    def _stop_reading(self, answered: bool) -> None:
        """The end of `call` alone: stops reading, gives back the in-flight slot
        of an answered request, and wakes a caller still waiting to read on."""
        with self._state:
            self._reading = False
            if answered and self._closed is None:
                self._in_flight -= 1
                if self._room_waiters:
                    self._room.notify()
            if not self._sleepers:
                return
            successor = next((waiting for waiting in self._sleepers if not waiting._done), None)
        if successor is not None:
            successor._wake.set()  # type: ignore[union-attr]

    def _wait_for_room(self, deadline: Deadline) -> None:
        """With `_state` held: until fewer than the daemon's bound are unanswered."""
        self._room_waiters += 1
        try:
            while self._in_flight >= self.session.max_in_flight and self._closed is None:
                remaining = deadline.remaining()
                if remaining == 0:
                    raise TooManyInFlight(
                        f"{self.session.max_in_flight} requests are already unanswered "
                        "on this connection"
                    )
                self._room.wait(remaining)
        finally:
            self._room_waiters -= 1
        if self._closed is not None:
            raise self._closed

    def send_and_forget(self, request: AnyRequest) -> None:
        """Sends a request whose answer nobody waits for (cancels, late releases).

        Its answer is read, and dropped, by whichever call reads next.
        """
        try:
            self.submit(request, Deadline(0))
        except RatekeeperError as error:
            log.debug("could not send %s: %s", type(request).__name__, error)

    def wait(self, future: Future, deadline: Deadline) -> p.Response:
        """The answer of `future`, reading the socket when no other caller does.

        Raises `Timeout` at the deadline and `ConnectionLost` when the
        connection broke.
        """
        while not future._done:
            with self._state:
                if future._done:
                    break
                reader = not self._reading
                if reader:
                    self._reading = True
                else:
                    wake = future._wake
                    if wake is None:
                        wake = future._wake = Wake()
                    self._sleepers[future] = None
            if reader:
                try:
                    self._read(deadline, NO_ID, future)
                finally:
                    self._stop_reading(False)
            else:
                wake.wait(deadline.remaining())
                if future._done:
                    break  # its deliverer took it off the sleepers
                with self._state:
                    self._sleepers.pop(future, None)
                    wake.clear()
            if not future._done and deadline.expired:
                raise Timeout
        if future._error is not None:
            raise future._error
        return future._result  # type: ignore[return-value]  # `future.result()`

    def _deliver_all(self, answers: Iterable[tuple[int, p.Response]]) -> None:
        """Completes the futures of `answers` (one read's) in one lock section,
        taking them off the sleepers, then wakes their callers: a woken caller
        finds its answer without taking the lock again, so it does not queue
        behind the reader still delivering."""
        completed = []
        about_connection = []
        with self._state:
            for request_id, response in answers:
                if request_id == 0:
                    about_connection.append(response)
                    continue
                future = self._pending.pop(request_id, None)
                if future is None:
                    continue  # not ours (an answer after the connection failed)
                if future.counted:
                    self._in_flight -= 1
                    if self._room_waiters:
                        self._room.notify()
                future._result = response
                future._done = True
                if future._wake is not None or future._callbacks is not None:
                    self._sleepers.pop(future, None)
                    completed.append(future)
        for future in completed:
            future._completed()
        for response in about_connection:
            connection_answer(response)

    def _fail(self, reason: ConnectionLost) -> None:
        with self._state:
            if self._closed is not None:
                return
            self._closed = reason
            pending, self._pending = self._pending, {}
            self._in_flight = 0
            for future in pending.values():
                future._error = reason
                future._done = True
            self._sleepers.clear()  # every one of them is woken below
            self._room.notify_all()
        for future in pending.values():
            future._completed()
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)  # wakes a reader blocked in recv
        self._sock.close()

    def close(self) -> None:
        """Closes the connection; waiting calls fail with `SidecarUnavailable`."""
        self._fail(ConnectionLost("the client was closed"))

    def forget(self) -> None:
        """In a forked child: drop this process's copy of the parent's socket.

        Only the file descriptor is closed; a shutdown would cut the parent off.
        """
        with contextlib.suppress(OSError):
            self._sock.close()
