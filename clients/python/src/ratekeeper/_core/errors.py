"""The failures the client detects itself, beside the protocol's error codes
(`_proto.errors`): a denial raised as `RateLimited` (`BudgetExhausted` when
a spend budget refused), a sidecar that cannot be
reached or whose connection broke, and the warning of a call let through
unlimited meanwhile.
"""

from __future__ import annotations

from typing import Optional

from .._proto.errors import RatekeeperError


class RateLimited(RatekeeperError):
    """The limit cannot serve the acquire within its `max_wait`; nothing was reserved.

    `retry_after` is the earliest delay in seconds after which the same acquire
    could be granted (a web app can answer 503 with this `Retry-After`);
    `bucket` names the bucket that refused (`"tokens"`, `"requests"`, `"tenant"`, …).
    """

    retryable = True

    def __init__(self, retry_after: float, bucket: str, limit: str = "") -> None:
        where = f" on limit {limit!r}" if limit else ""
        super().__init__(
            f"rate limited by the {bucket!r} bucket{where}; retry after {retry_after}s"
        )
        self.retry_after = retry_after
        self.bucket = bucket
        self.limit = limit


class BudgetExhausted(RateLimited):
    """A spend budget refused the acquire: the money it allows for its period
    is spent. A `RateLimited`, so code that backs off on a denial keeps
    working, but waiting a moment will not help: `retry_after` is the time
    to the budget period's reset (a day, a month), and `bucket` names the
    budget (`"budget_day"`, `"tenant_budget_month"`, ...).
    """

    retryable = False

    def __init__(self, retry_after: float, bucket: str, limit: str = "") -> None:
        super().__init__(retry_after, bucket, limit)
        where = f" on limit {limit!r}" if limit else ""
        self.message = f"spend budget {bucket!r}{where} is exhausted; it resets in {retry_after}s"
        self.args = (self.message,)


def denied(retry_after: float, bucket: str, limit: str = "") -> RateLimited:
    """The exception of a denial: `BudgetExhausted` when the bucket is a spend
    budget's (its name contains `budget`, PROTOCOL.md §4.2), else `RateLimited`."""
    kind = BudgetExhausted if BUDGET in bucket else RateLimited
    return kind(retry_after, bucket, limit)


#: What every spend budget's bucket name contains, and no other bucket's.
BUDGET = "budget"


class SidecarUnavailable(RatekeeperError):
    """The daemon could not be reached, or the connection broke, within the call's deadline."""

    retryable = True


class SidecarUnavailableWarning(RuntimeWarning):
    """Issued when a call proceeds unlimited because the sidecar is unreachable ("allow")."""


class ConnectionLost(SidecarUnavailable):
    """The connection broke under a request; the call may retry on a new one."""


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


def describe(error: BaseException) -> str:
    """An error in a sentence, for a warning or a log line."""
    if isinstance(error, RatekeeperError):
        return error.message or type(error).__name__
    return f"{type(error).__name__}: {error}"
