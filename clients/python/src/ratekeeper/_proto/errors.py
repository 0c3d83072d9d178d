"""The protocol's error codes, one exception class each, under `RatekeeperError`.

The daemon answers a failed request with a stable numeric code (PROTOCOL.md §7)
and a message for humans. The client maps each code to one exception class and
never parses the message. A denial is not an error code but a normal answer;
the client still raises it, as `RateLimited` (`_core.errors`, with the other
failures the client detects itself), because the caller cannot proceed.
"""

from __future__ import annotations

import enum
from typing import ClassVar, Optional


class ErrorCode(enum.IntEnum):
    """The numbers of PROTOCOL.md §7. They never change meaning; new ones are added."""

    UNSUPPORTED_VERSION = 1
    HELLO_REQUIRED = 2
    FRAME_TOO_LARGE = 3
    MALFORMED_MESSAGE = 4
    INVALID_REQUEST = 5
    UNKNOWN_LIMIT = 6
    UNKNOWN_PRIORITY = 7
    COST_EXCEEDS_CAPACITY = 8
    DUPLICATE_REQUEST_ID = 9
    TOO_MANY_IN_FLIGHT = 10
    UNKNOWN_LEASE = 11
    CANCELLED = 12
    STORE_UNAVAILABLE = 13
    SHUTTING_DOWN = 14
    INTERNAL = 15
    UNSUPPORTED = 16
    OVERLOADED = 17


class RatekeeperError(Exception):
    """Base of every exception this package raises.

    `code` is the protocol error code (None for conditions the client detects
    itself); `retryable` says whether the same call can succeed later.
    """

    code: ClassVar[Optional[int]] = None
    retryable: ClassVar[bool] = False

    def __init__(self, message: str = "") -> None:
        super().__init__(message)
        self.message = message


class ProtocolError(RatekeeperError):
    """The bytes on the connection broke the protocol (either side); the connection is closed."""


class UnsupportedVersion(ProtocolError):
    """The daemon does not speak this client's protocol version (code 1)."""

    code = ErrorCode.UNSUPPORTED_VERSION


class HelloRequired(ProtocolError):
    """The first frame on the connection was not `Hello` (code 2)."""

    code = ErrorCode.HELLO_REQUIRED


class FrameTooLarge(ProtocolError):
    """A frame's declared length exceeds the maximum (code 3)."""

    code = ErrorCode.FRAME_TOO_LARGE


class MalformedMessage(ProtocolError):
    """A payload did not decode: unknown tag, truncated field, invalid byte (code 4)."""

    code = ErrorCode.MALFORMED_MESSAGE


class DuplicateRequestId(ProtocolError):
    """A request id was reused while its request was unanswered (code 9)."""

    code = ErrorCode.DUPLICATE_REQUEST_ID


class InvalidRequest(RatekeeperError):
    """Well-formed but unacceptable: a zero cost, a name above 128 bytes, … (code 5)."""

    code = ErrorCode.INVALID_REQUEST


class UnknownLimit(RatekeeperError):
    """The named limit is not in the daemon's configuration (code 6)."""

    code = ErrorCode.UNKNOWN_LIMIT


class UnknownPriority(RatekeeperError):
    """The priority class is not configured or does not apply to the limit (code 7)."""

    code = ErrorCode.UNKNOWN_PRIORITY


class CostExceedsCapacity(RatekeeperError):
    """The cost exceeds what one of the limit's buckets can ever hold: never grantable (code 8)."""

    code = ErrorCode.COST_EXCEEDS_CAPACITY


class TooManyInFlight(RatekeeperError):
    """The connection already has the maximum number of unanswered requests (code 10)."""

    code = ErrorCode.TOO_MANY_IN_FLIGHT
    retryable = True


class UnknownLease(RatekeeperError):
    """The lease was never granted, is already settled, or was forgotten (code 11)."""

    code = ErrorCode.UNKNOWN_LEASE


class Cancelled(RatekeeperError):
    """The acquire was cancelled before it was granted (code 12)."""

    code = ErrorCode.CANCELLED


class StoreUnavailable(RatekeeperError):
    """The bucket store (Redis) failed and the daemon's failure policy denies (code 13)."""

    code = ErrorCode.STORE_UNAVAILABLE
    retryable = True


class ShuttingDown(RatekeeperError):
    """The daemon is draining for shutdown and takes no new work (code 14)."""

    code = ErrorCode.SHUTTING_DOWN
    retryable = True


class InternalError(RatekeeperError):
    """A bug in the daemon; the message says what (code 15)."""

    code = ErrorCode.INTERNAL


class Unsupported(RatekeeperError):
    """The daemon does not provide what was asked, e.g. counting message tokens (code 16)."""

    code = ErrorCode.UNSUPPORTED


class Overloaded(RatekeeperError):
    """The daemon is at one of its resource bounds, e.g. its queue of prompts to count (code 17)."""

    code = ErrorCode.OVERLOADED
    retryable = True


class UnknownErrorCode(RatekeeperError):
    """An error code this client does not know (a newer daemon): a non-retryable failure."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"error code {code}: {message}")
        self.code = code  # type: ignore[misc]  # an instance value for unknown codes


#: Every known code and its exception class, one to one.
ERROR_CLASSES: dict[int, type[RatekeeperError]] = {
    cls.code: cls
    for cls in (
        UnsupportedVersion,
        HelloRequired,
        FrameTooLarge,
        MalformedMessage,
        InvalidRequest,
        UnknownLimit,
        UnknownPriority,
        CostExceedsCapacity,
        DuplicateRequestId,
        TooManyInFlight,
        UnknownLease,
        Cancelled,
        StoreUnavailable,
        ShuttingDown,
        InternalError,
        Unsupported,
        Overloaded,
    )
    if cls.code is not None
}


def error_for_code(code: int, message: str) -> RatekeeperError:
    """The exception for an `Error{code, message}` answer; unknown codes are not retryable."""
    cls = ERROR_CLASSES.get(code)
    if cls is None:
        return UnknownErrorCode(code, message)
    return cls(message)


def closes_connection(code: int, request_id: int) -> bool:
    """Whether the daemon closes the connection after sending this code with this request id.

    `OVERLOADED` closes it only on request id 0, where it speaks of the connection.
    """
    if code == ErrorCode.OVERLOADED:
        return request_id == 0
    return code in (
        ErrorCode.UNSUPPORTED_VERSION,
        ErrorCode.HELLO_REQUIRED,
        ErrorCode.FRAME_TOO_LARGE,
    )
