"""Time, as both clients bound it: a call's deadline, and the pauses before a
settlement the daemon could not apply is sent again.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Optional

from .._proto.errors import ErrorCode, RatekeeperError


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
