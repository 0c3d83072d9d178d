"""The client's options that never wait: where the sidecar is, whom it must run
as, the name the client gives it, timeouts, and what a call does while the
sidecar is away (`on_unavailable`). Both clients check their arguments here.
"""

from __future__ import annotations

import os
import sys
from typing import Literal, Optional, Union

from .. import _proto as p

#: The daemon's socket when neither the argument nor RATEKEEPER_SOCKET names
#: one and the session has no XDG_RUNTIME_DIR (a system service's, as the
#: systemd unit and the Kubernetes manifests have it). See `default_socket`.
DEFAULT_SOCKET = "/run/ratekeeper/ratekeeper.sock"


#: Environment variable naming the socket, as for the daemon and its CLI.
ENV_SOCKET = "RATEKEEPER_SOCKET"


#: Environment variable naming the uid the daemon must run as (`expected_uid`).
ENV_EXPECTED_UID = "RATEKEEPER_EXPECTED_UID"


#: Default for `timeout`: how long a call may spend on I/O beyond its own wait.
DEFAULT_TIMEOUT = 5.0


#: Default for `connect_timeout`: how long a call waits for a sidecar nobody
#: listens for (a missing socket file, a refused connect). None at all: a
#: stopped sidecar costs a call microseconds, not a wait for a successor that
#: may never come.
DEFAULT_CONNECT_TIMEOUT = 0.0


#: What `on_unavailable` accepts: raise `SidecarUnavailable`, or proceed unlimited.
OnUnavailable = Literal["raise", "allow"]


ON_UNAVAILABLE: tuple[OnUnavailable, ...] = ("raise", "allow")


def default_socket() -> str:
    """The daemon's default socket, as the daemon computes it: in the session's
    own runtime directory (XDG_RUNTIME_DIR, private to its user) when it is an
    absolute path, else `DEFAULT_SOCKET`. Never in /tmp, where any local user
    could bind the path first and receive every prompt."""
    runtime_dir = os.environ.get("XDG_RUNTIME_DIR", "")
    if os.path.isabs(runtime_dir):
        return os.path.join(runtime_dir, "ratekeeper.sock")
    return DEFAULT_SOCKET


def socket_path(path: Optional[Union[str, os.PathLike]]) -> str:
    """The socket to use: the argument, else RATEKEEPER_SOCKET, else the default."""
    if path is not None:
        return os.fspath(path)
    return os.environ.get(ENV_SOCKET) or default_socket()


def expected_uid(uid: Optional[int]) -> Optional[int]:
    """The uid the daemon must run as: the argument, else RATEKEEPER_EXPECTED_UID, else None."""
    if uid is None:
        named = os.environ.get(ENV_EXPECTED_UID, "").strip()
        if not named:
            return None
        try:
            uid = int(named)
        except ValueError:
            raise ValueError(
                f"{ENV_EXPECTED_UID} must be a uid (a number), not {named!r}"
            ) from None
    if isinstance(uid, bool) or not isinstance(uid, int) or uid < 0:
        raise ValueError(f"expected_uid must be a uid (an int >= 0), not {uid!r}")
    return uid


def default_client_name() -> str:
    """`"<program> pid=<pid>"`, computed at each connect so a forked child names itself."""
    program = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "python"
    return clip_name(f"{program or 'python'} pid={os.getpid()}")


def clip_name(name: str, limit: int = p.MAX_NAME_LEN) -> str:
    """`name` cut to at most `limit` bytes of UTF-8, at a character boundary.

    The daemon bounds a client name in bytes (PROTOCOL.md §8) and refuses a
    longer `Hello`; a cut by characters lets a non-ASCII name pass that bound.
    A character UTF-8 cannot carry (a lone surrogate, as `sys.argv` holds for
    a file name that is not UTF-8) becomes "?", so the name always encodes.
    """
    # Cutting valid UTF-8 can split only its last character: "ignore" drops that part.
    return name.encode("utf-8", "replace")[:limit].decode("utf-8", "ignore")


def check_on_unavailable(value: str) -> OnUnavailable:
    if value not in ON_UNAVAILABLE:
        raise ValueError(f"on_unavailable must be one of {ON_UNAVAILABLE}, got {value!r}")
    return value  # type: ignore[return-value]


def check_seconds(name: str, value: float) -> float:
    """A non-negative number of seconds (a timeout option), as a float."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number of seconds, got {type(value).__name__}")
    if not value >= 0:
        raise ValueError(f"{name} must not be negative, got {value}")
    return float(value)
