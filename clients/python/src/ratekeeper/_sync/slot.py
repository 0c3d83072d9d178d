"""The blocking client's connection slot, and what `fork` does to it.

After `fork` the child never touches the parent's socket: a fork hook (and a
pid check on every call) drops the inherited connection without shutting it
down, and the child opens its own on first use. Written by hand, part of
the blocking transport: `transport.py` re-exports `Slot`, beside
`Connection`, as `_async/transport.py` has its own.
"""

from __future__ import annotations

import os
import threading
import weakref
from typing import TYPE_CHECKING, Callable, Optional

from .._core.deadlines import Deadline
from .._core.errors import unavailable

if TYPE_CHECKING:
    from .transport import Connection

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

    @property
    def reconnecting(self) -> bool:
        """Whether this process's connection broke or was retired: its daemon may be restarting."""
        conn = self.conn
        return conn is not None and conn.pid == os.getpid() and not conn.usable

    def ready(self) -> Optional[Connection]:
        """The connection if it is usable now; otherwise `get` opens another."""
        conn = self.conn
        usable = conn is not None and conn._closed is None and not conn.retired
        if usable and conn.pid == os.getpid():  # type: ignore[union-attr]  # `conn.usable`
            return conn
        return None

    def get(self, deadline: Deadline, connect: Callable[[Deadline], Connection]) -> Connection:
        """The usable connection, or a new one from `connect` (one caller connects at a time)."""
        if self._pid != os.getpid():
            self._reset_after_fork()
        conn = self.conn
        if conn is not None and conn.usable:
            return conn
        if not self._lock.acquire(timeout=-1 if deadline.at is None else deadline.remaining()):
            raise unavailable(self.path, TimeoutError("another thread is connecting"))
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
