"""What the sync and asyncio clients share that never waits.

`Session` is the sans-IO state of one connection (request ids, the `Hello`
exchange, the frame decoder). The functions below build requests from the
public API's arguments and turn answers into results or exceptions. The policy
that does wait (retries, reconnects, settling) is written once in `_async.py`
and generated into `_sync.py`; the connections it drives are `_io_async.py` and
`_io_sync.py`.
"""

from __future__ import annotations

import inspect
import logging
import os
import socket
import struct
import sys
import time
import urllib.error
from collections.abc import Iterator
from typing import Any, Callable, Literal, Optional, Union

from . import _proto as p
from ._proto.errors import (
    ErrorCode,
    ProtocolError,
    RatekeeperError,
    RateLimited,
    SidecarUnavailable,
    UnsupportedVersion,
    closes_connection,
)
from ._requests import AcquireRequest, AnyRequest, Settlement, token_count
from ._requests import MessageLike as MessageLike  # for the clients' signatures

log = logging.getLogger("ratekeeper")

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

#: Bytes asked of the socket per read.
RECV_SIZE = 64 * 1024

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


class Session:
    """The sans-IO state of one connection: ids, `Hello`, received bytes."""

    def __init__(self, client_name: str) -> None:
        self.client_name = clip_name(client_name)
        self.decoder = p.FrameDecoder(p.ServerFrame)
        self.hello: Optional[p.HelloReply] = None
        #: Most unanswered requests the daemon allows (announced in its `Hello`).
        self.max_in_flight = p.MAX_IN_FLIGHT
        #: The largest request payload: what the daemon announced, within the spec's bound.
        self.max_frame_len = p.MAX_FRAME_LEN
        self._last_id = 0

    def next_id(self) -> int:
        """A fresh request id: a counter from 1 that skips 0 if it ever wraps."""
        self._last_id = self._last_id % (2**64 - 1) + 1
        return self._last_id

    def hello_frame(self) -> tuple[int, bytes]:
        request_id = self.next_id()
        hello = p.Hello(protocol_version=p.PROTOCOL_VERSION, client_name=self.client_name)
        return request_id, p.encode_frame(p.ClientFrame(request_id, hello))

    def accept_hello(self, frame: p.ServerFrame) -> p.HelloReply:
        """Checks the daemon's answer to `Hello`; raises when it refused us."""
        response = frame.response
        if isinstance(response, p.ErrorReply):
            raise response.exception()
        if not isinstance(response, p.HelloReply):
            raise ProtocolError(f"expected Hello, the daemon answered {type(response).__name__}")
        if response.protocol_version != p.PROTOCOL_VERSION:
            raise UnsupportedVersion(
                f"the daemon speaks protocol version {response.protocol_version}; "
                f"this client speaks {p.PROTOCOL_VERSION}"
            )
        self.hello = response
        self.max_in_flight = response.max_in_flight
        self.max_frame_len = min(response.max_frame_len, p.MAX_FRAME_LEN)
        return response

    def receive_hello(self, hello_id: int, data: bytes) -> Optional[list[p.ServerFrame]]:
        """Feeds bytes received after `Hello`; None until its answer is in.

        Then checks the answer (raising when the daemon refused us) and returns
        the frames that arrived after it, for the connection to deliver.
        """
        self.decoder.receive_data(data)
        return self.hello_answer(hello_id)

    def hello_answer(self, hello_id: int) -> Optional[list[p.ServerFrame]]:
        """`receive_hello` for bytes already in the decoder (received into its buffer)."""
        frames = self.decoder.frames()
        if not frames:
            return None
        if frames[0].request_id not in (hello_id, 0):
            raise ProtocolError(f"answer to request {frames[0].request_id} before Hello")
        self.accept_hello(frames[0])
        return frames[1:]

    def request_frame(self, request: AnyRequest) -> tuple[int, bytes]:
        """Allocates an id for `request` and encodes it within the daemon's bound."""
        self._last_id = request_id = self._last_id % 18446744073709551615 + 1  # next_id
        kind = type(request)
        if kind is AcquireRequest or kind is Settlement:  # packed without a message
            return request_id, request.frame(request_id, self.max_frame_len)
        return request_id, p.encode_request(request_id, request, self.max_frame_len)

    def receive_data(self, data: bytes) -> Iterator[p.ServerFrame]:
        """Feeds `data`, then yields each frame it completed, in order.

        A broken stream raises `ProtocolError` after the frames before it.
        """
        decoder = self.decoder
        decoder.receive_data(data)
        while True:
            frame = decoder.next_frame()
            if frame is p.NEED_DATA:
                return
            yield frame


def connection_answer(response: p.Response) -> None:
    """An answer addressed to request id 0, about the connection itself.

    Raises the error when the daemon closes the connection after it (the
    connection then fails with it); anything else is logged and dropped.
    """
    if isinstance(response, p.ErrorReply) and closes_connection(response.code, 0):
        raise response.exception()
    log.warning("the sidecar sent a connection-level answer: %r", response)


class ConnectionLost(SidecarUnavailable):
    """The connection broke under a request; the call may retry on a new one."""


#: The requests answered at once, which never count against the daemon's
#: in-flight bound (PROTOCOL.md §5.2): `type(request) not in NOT_COUNTED`.
NOT_COUNTED = frozenset((p.Ping, p.Cancel))


class Deadline:
    """A point in monotonic time, or none (wait as long as it takes)."""

    __slots__ = ("at",)

    def __init__(self, seconds: Optional[float]) -> None:
        self.at = None if seconds is None else time.monotonic() + (seconds if seconds > 0 else 0.0)

    def remaining(self) -> Optional[float]:
        if self.at is None:
            return None
        return max(0.0, self.at - time.monotonic())

    @property
    def expired(self) -> bool:
        return self.at is not None and time.monotonic() >= self.at

    def earlier(self, seconds: float) -> Deadline:
        """This deadline or `seconds` from now, whichever comes first."""
        other = Deadline(seconds)
        if self.at is not None and other.at is not None and self.at < other.at:
            other.at = self.at
        return other


def reconnect_delays() -> Iterator[float]:
    """Pauses between connect attempts: 5 ms doubling to 250 ms."""
    delay = 0.005
    while True:
        yield delay
        delay = min(delay * 2, 0.25)


#: Pauses before each new attempt at a settlement the daemon could not apply:
#: 50 ms doubling, so at most four attempts and 0.35 s of pauses in all.
SETTLE_RETRY_DELAYS = (0.05, 0.1, 0.2)


def settle_retry_pause(
    error: RatekeeperError, pauses: Iterator[float], deadline: Deadline
) -> Optional[float]:
    """The pause before settling a lease again after `error`, or None to raise it.

    Only `StoreUnavailable` is retried: the daemon answers it to a `Report` or
    `Release` whose refund it could not apply (a Redis call timed out), and
    keeps the lease so that the same settlement can be sent again; the lease
    is settled at most once, so a retry can never refund twice. Pauses come
    from `pauses` (`SETTLE_RETRY_DELAYS`), and none ends past `deadline`.
    """
    if error.code != ErrorCode.STORE_UNAVAILABLE:
        return None
    pause = next(pauses, None)
    remaining = deadline.remaining()
    if pause is None or (remaining is not None and remaining <= pause):
        return None
    return pause


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


def unavailable(path: str, cause: Optional[BaseException]) -> SidecarUnavailable:
    if isinstance(cause, FileNotFoundError):
        reason = ": no socket file there (is `ratekeeper serve` running on that socket?)"
    elif isinstance(cause, ConnectionRefusedError):
        reason = ": connection refused, nobody listens on the socket file (a crashed daemon's?)"
    else:
        reason = f": {cause}" if cause else ""
    return SidecarUnavailable(f"the ratekeeper sidecar at {path} is unavailable{reason}")


def connection_lost(reason: str) -> SidecarUnavailable:
    return SidecarUnavailable(f"the connection to the ratekeeper sidecar was lost: {reason}")


# ---------------------------------------------------------------------------
# Answers
# ---------------------------------------------------------------------------


def expect(response: p.Response, kind: type) -> Any:
    """`response` if it is a `kind`; the mapped exception if it is an error."""
    if isinstance(response, kind):
        return response
    if isinstance(response, p.ErrorReply):
        raise response.exception()
    raise ProtocolError(f"expected {kind.__name__}, the daemon answered {type(response).__name__}")


def granted_or_raise(response: p.Response, limit: str) -> p.Granted:
    """The grant, or `RateLimited` for a denial, or the mapped error."""
    if isinstance(response, p.Denied):
        raise RateLimited(response.retry_after_ms / 1000.0, response.bucket, limit)
    return expect(response, p.Granted)


# ---------------------------------------------------------------------------
# A provider call that failed
# ---------------------------------------------------------------------------

#: How a lease settles after its provider call failed (see `failed_call`):
#: `settle_as_rejected`, `release` or `settle_as_reserved`.
FailedCall = Literal["rejected", "release", "keep"]


def _http_status(value: Any) -> bool:
    return type(value) is int and 100 <= value <= 599


def provider_status(error: BaseException) -> Optional[int]:
    """The HTTP status of the provider's answer that `error` reports, if any:
    `status_code` (the openai and anthropic SDKs' `APIStatusError`), else
    `response.status_code` (httpx's `HTTPStatusError`, requests' `HTTPError`),
    else the standard library's `urllib.error.HTTPError.code`."""
    status = getattr(error, "status_code", None)
    if not _http_status(status):
        status = getattr(getattr(error, "response", None), "status_code", None)
    if not _http_status(status) and isinstance(error, urllib.error.HTTPError):
        status = error.code
    return status if _http_status(status) else None


def failed_call(error: BaseException, called: bool) -> FailedCall:
    """What a provider call that raised `error` leaves of its lease (the
    wrappers' rule, and a `with lease:` block's).

    - `"rejected"`: a 429. The provider's rate limiter refused the request
      and still counts it (OpenAI: "unsuccessful requests contribute to your
      per-minute limit"); giving it back would let every retry find room the
      provider no longer has.
    - `"release"`: a 529 (Anthropic's "overloaded": the API short of capacity
      for all its users, not a decision of this organisation's rate limiter)
      or another 4xx: refused, never processed. A retry still backs off.
    - `"keep"`: another status (5xx): it may have been processed.
    - Without a status: `"keep"` when the call itself raised (`called`: a
      timeout or a broken connection may have been processed), `"release"`
      when it may not have been made (the body of a `with` block).
    """
    status = provider_status(error)
    if status == 429:
        return "rejected"
    if status is None:
        return "keep" if called else "release"
    if status == 529 or 400 <= status < 500:
        return "release"
    return "keep"


def report_counts(
    used: Optional[int], input_tokens: Optional[int], output_tokens: Optional[int]
) -> tuple[int, int]:
    """`report(used)` or `report(input_tokens=, output_tokens=)` as the wire's two counts.

    A single total is sent as input tokens: limits that share one token bucket
    only look at the sum.
    """
    if type(used) is int and used >= 0 and input_tokens is None and output_tokens is None:
        return used, 0  # the usual: report(total)
    if used is not None:
        if input_tokens is not None or output_tokens is not None:
            raise ValueError("give either used or input_tokens/output_tokens, not both")
        return token_count("used", used), 0
    if input_tokens is None and output_tokens is None:
        raise ValueError("report needs used, or input_tokens and/or output_tokens")
    return (
        0 if input_tokens is None else token_count("input_tokens", input_tokens),
        0 if output_tokens is None else token_count("output_tokens", output_tokens),
    )


#: What a decorated function's `usage` returns: a total, `(input, output)`, or None (unknown).
Usage = Union[int, tuple[int, int], None]


def usage_counts(used: Usage) -> Optional[tuple[int, int]]:
    """`usage(result)` of a decorated function as (input, output) tokens; None if unknown.

    A single total is counted as input tokens, as `report(used)` does.
    """
    if used is None:
        return None
    if isinstance(used, tuple):
        if len(used) != 2:
            raise ValueError(f"usage must return a total or (input, output), got {used!r}")
        return token_count("input_tokens", used[0]), token_count("output_tokens", used[1])
    return token_count("used", used), 0


def check_decorated(function: Callable[..., Any], coroutines: bool, client: str) -> None:
    """Refuses a function the client cannot limit: the asyncio client takes
    coroutine functions, the blocking one plain functions (not generators)."""
    name = getattr(function, "__qualname__", repr(function))
    if not callable(function):
        raise TypeError(f"{client}.limit decorates functions, got {name}")
    if inspect.isgeneratorfunction(function) or inspect.isasyncgenfunction(function):
        raise TypeError(f"{client}.limit cannot limit the generator function {name}")
    if inspect.iscoroutinefunction(function) != coroutines:
        other = "Client" if coroutines else "AsyncClient"
        kind = "coroutine" if coroutines else "plain (not async)"
        raise TypeError(f"{client}.limit decorates {kind} functions; use {other}.limit for {name}")


def deliver_answers(decoder: p.FrameDecoder, deliver: Any) -> Optional[ConnectionLost]:
    """Hands every whole answer in `decoder` to `deliver(request_id, response)`;
    on a protocol error, why the connection must close."""
    try:
        answer = decoder.next_answer()
        while answer is not p.NEED_DATA:
            deliver(answer[0], answer[1])
            answer = decoder.next_answer()
    except ProtocolError as error:
        log.error("closing the connection to the sidecar: %s", error)
        return ConnectionLost(f"protocol error: {error}")
    return None


def describe(error: BaseException) -> str:
    """An error in a sentence, for a warning or a log line."""
    if isinstance(error, RatekeeperError):
        return error.message or type(error).__name__
    return f"{type(error).__name__}: {error}"
