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

After `fork` the child never touches the parent's socket: a fork hook (and a
pid check on every call) drops the inherited connection without shutting it
down, and the child opens its own on first use.

`_io_async` has the same names and signatures with `async`: the policy in
`_async.py` (and `_sync.py`, generated from it) is written against them once.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import socket
import threading
import time
import weakref
from concurrent.futures import Future
from typing import Callable, Optional

from . import _core as core
from . import _protocol as p
from ._core import ConnectionLost
from ._errors import ProtocolError, RatekeeperError, TooManyInFlight

log = logging.getLogger("ratekeeper")

#: What `Connection.wait` raises at its deadline.
Timeout = TimeoutError


def sleep(seconds: float) -> None:
    """Blocks the calling thread (`time.sleep`, looked up at each call)."""
    time.sleep(seconds)


class Connection:
    """One socket to the daemon that has exchanged `Hello`.

    No thread of its own: a caller waiting for an answer becomes the reader
    while nobody else reads, decodes whatever arrives and completes the
    futures of the other callers; when its own answer is in, it hands the
    reading over to a caller still waiting. One thread alone therefore reads
    its own answers without a thread switch, and many threads share one
    socket without mixing up answers.
    """

    def __init__(
        self, session: core.Session, sock: socket.socket, leftover: list[p.ServerFrame]
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
        self._sleepers: dict[threading.Event, Future] = {}  # callers waiting on the reader
        #: Set when the daemon said ShuttingDown: new acquires go elsewhere.
        self.retired = False
        self._slots = threading.BoundedSemaphore(session.max_in_flight)
        for frame in leftover:
            self._deliver(frame)

    @classmethod
    def open(cls, path: str, client_name: str, deadline: core.Deadline) -> Connection:
        """Connects to `path` and exchanges `Hello`, within `deadline` (at least 50 ms)."""
        session = core.Session(client_name)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            remaining = deadline.remaining()
            sock.settimeout(None if remaining is None else max(remaining, 0.05))
            sock.connect(path)
            hello_id, hello = session.hello_frame()
            sock.sendall(hello)
            leftover = None
            while leftover is None:
                data = sock.recv(core.RECV_SIZE)
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

    def submit(self, request: p.Request, deadline: core.Deadline) -> tuple[int, Future]:
        """Sends `request`; the future completes with its answer or `ConnectionLost`.

        Waits until `deadline` for one of the daemon's in-flight slots, then
        raises `TooManyInFlight`.
        """
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
            self._fail(ConnectionLost(f"sending failed: {error}"))
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

        Raises `Timeout` at the deadline and `ConnectionLost` when the
        connection broke.
        """
        wake = threading.Event()
        future.add_done_callback(lambda _: wake.set())
        while not future.done():
            if deadline.expired:
                raise Timeout
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
                data = self._sock.recv(core.RECV_SIZE)
                if not data:
                    self._fail(ConnectionLost("the daemon closed the connection"))
                    return
                for frame in self.session.receive_data(data):
                    self._deliver(frame)
        except ProtocolError as error:
            log.error("closing the connection to the sidecar: %s", error)
            self._fail(ConnectionLost(f"protocol error: {error}"))
        except OSError as error:
            self._fail(ConnectionLost(str(error)))

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
            core.connection_answer(frame.response)
            return
        with self._state:
            future = self._pending.pop(frame.request_id, None)
        if future is None:
            return  # the answer to a request sent and forgotten
        if future.counted:  # type: ignore[attr-defined]
            self._slots.release()
        future.set_result(frame.response)

    def _fail(self, reason: ConnectionLost) -> None:
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
        self._fail(ConnectionLost("the client was closed"))

    def forget(self) -> None:
        """In a forked child: drop this process's copy of the parent's socket.

        Only the file descriptor is closed; a shutdown would cut the parent off.
        """
        with contextlib.suppress(OSError):
            self._sock.close()


#: Every live slot, for the fork hook.
_slots: weakref.WeakSet = weakref.WeakSet()


class Slot:
    """Holds a client's connection: one thread at a time opens the next one.

    The connection is closed when `owner` (the client) is collected, and
    dropped, without a shutdown, in a forked child.
    """

    def __init__(self, path: str, owner: object) -> None:
        self.path = path
        self.conn: Optional[Connection] = None
        #: Whether the last connect gave up on the sidecar (the policy's note).
        self.down = False
        self._pid = os.getpid()
        self._lock = threading.Lock()
        weakref.finalize(owner, _close_slot, self, self._pid)
        _slots.add(self)

    def get(
        self, deadline: core.Deadline, connect: Callable[[core.Deadline], Connection]
    ) -> Connection:
        """The usable connection, or a new one from `connect` (one caller connects at a time)."""
        if self._pid != os.getpid():
            self._reset_after_fork()
        conn = self.conn
        if conn is not None and conn.usable:
            return conn
        if not self._lock.acquire(timeout=-1 if deadline.at is None else deadline.remaining()):
            raise core.unavailable(self.path, TimeoutError("another thread is connecting"))
        try:
            conn = self.conn
            if conn is not None and conn.usable:
                return conn
            conn = connect(deadline)
            self.conn = conn
            return conn
        finally:
            self._lock.release()

    def close(self) -> None:
        """Closes the connection, if this process opened it."""
        conn, self.conn = self.conn, None
        if conn is not None and conn.pid == os.getpid():
            conn.close()

    def _reset_after_fork(self) -> None:
        conn, self.conn = self.conn, None
        if conn is not None and conn.pid != os.getpid():
            conn.forget()
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self.down = False


def _close_slot(slot: Slot, pid: int) -> None:
    """The finalizer of a collected client: closes its connection in the process that made it."""
    conn, slot.conn = slot.conn, None
    if conn is not None and conn.pid == os.getpid() == pid:
        conn.close()


def _after_fork_in_child() -> None:
    for slot in list(_slots):
        slot._reset_after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
