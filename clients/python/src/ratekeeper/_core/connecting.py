"""What a connect attempt found, for both transports: the daemon's identity
(`check_peer`), nobody there, or a daemon that did not take the connection
now; and the pauses between attempts.
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Iterator
from typing import Optional

from .errors import ConnectionLost
from .settings import ENV_EXPECTED_UID


def check_peer(sock: socket.socket, path: str, uid: Optional[int]) -> None:
    """Raises PermissionError, before anything is sent, when the process
    listening on `path` does not run as `uid` (None: no check). The kernel
    says who the peer is (SO_PEERCRED), so a socket another user bound first
    gets no prompt."""
    if uid is None:
        return
    credentials = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, peer_uid, _gid = struct.unpack("3i", credentials)
    if peer_uid != uid:
        raise PermissionError(
            f"the process listening on {path} runs as uid {peer_uid}, not the expected "
            f"uid {uid} (expected_uid, {ENV_EXPECTED_UID}): nothing was sent to it"
        )


def reconnect_delays() -> Iterator[float]:
    """Pauses between connect attempts: 5 ms doubling to 250 ms."""
    delay = 0.005
    while True:
        yield delay
        delay = min(delay * 2, 0.25)


def nobody_listening(error: BaseException) -> bool:
    """Whether a failed connect found no daemon: no socket file (a stopped
    daemon removes it), or one nobody listens on (refused: a crashed daemon
    leaves it behind). A successor may bind it soon, or never; waiting for it
    is the caller's choice (`connect_timeout`)."""
    return isinstance(error, (FileNotFoundError, ConnectionRefusedError))


def sidecar_busy(error: BaseException) -> bool:
    """Whether a failed connect found a daemon that did not take the connection
    now: reset or closed during `Hello`, or a full accept queue. It is there,
    so the connect is worth retrying within the call's `timeout`."""
    if nobody_listening(error):
        return False
    return isinstance(error, (ConnectionError, BlockingIOError, ConnectionLost))
