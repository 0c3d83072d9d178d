"""Retrying with tenacity on the errors' own advice, without depending on tenacity.

Every exception of this package says whether the same call can succeed later
(`retryable`), and a denial says when (`RateLimited.retry_after`). These are a
`retry=` predicate and a `wait=` strategy for tenacity built on them; they are
plain callables of tenacity's `RetryCallState`, so this module imports nothing
from tenacity and works with its sync and asyncio retrying alike:

    from tenacity import retry, stop_after_attempt
    from ratekeeper.retry import retry_if_retryable, wait_retry_after

    @retry(retry=retry_if_retryable, wait=wait_retry_after(), stop=stop_after_attempt(5))
    def summarize(text): ...

Combine them with tenacity's own with the tenacity object on the left:
`retry_if_exception_type(TimeoutError) | retry_if_retryable`,
`wait_random(0, 0.5) + wait_retry_after()`.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Optional, Union

from ._proto.errors import RatekeeperError

__all__ = ["is_retryable", "retry_after", "retry_if_retryable", "wait_retry_after"]


def is_retryable(error: Optional[BaseException]) -> bool:
    """Whether `error` is one of ours that the same call can get past later.

    `RateLimited`, `SidecarUnavailable`, `StoreUnavailable`, `ShuttingDown`,
    `TooManyInFlight` and `Overloaded` are; configuration and request errors
    (`UnknownLimit`, `CostExceedsCapacity`, …), `BudgetExhausted` (a spend
    budget resets in hours or days, no retry loop should sleep that long)
    and foreign exceptions are not.
    """
    return isinstance(error, RatekeeperError) and error.retryable


def retry_after(error: Optional[BaseException]) -> Optional[float]:
    """The delay in seconds `error` asks for (a denial's `retry_after`), or None."""
    delay = getattr(error, "retry_after", None) if isinstance(error, RatekeeperError) else None
    if isinstance(delay, bool) or not isinstance(delay, (int, float)) or math.isnan(delay):
        return None
    return max(0.0, float(delay))


def _failure(retry_state: Any) -> Optional[BaseException]:
    """The exception of the attempt tenacity just made, or None if it returned."""
    outcome = getattr(retry_state, "outcome", None)
    if outcome is None or not outcome.failed:
        return None
    return outcome.exception()


def retry_if_retryable(retry_state: Any) -> bool:
    """tenacity `retry=`: retry when the attempt raised a retryable ratekeeper error."""
    return is_retryable(_failure(retry_state))


class wait_retry_after:
    """tenacity `wait=`: the failed attempt's `retry_after`, else `fallback`.

    `fallback` (seconds, or another wait strategy such as
    `wait_exponential()`) applies to errors that name no delay, like
    `SidecarUnavailable`. The wait is capped at `maximum` seconds.
    """

    def __init__(
        self,
        fallback: Union[float, Callable[[Any], float]] = 1.0,
        maximum: float = 60.0,
    ) -> None:
        if not callable(fallback) and not fallback >= 0:
            raise ValueError(f"fallback must be a non-negative number of seconds, got {fallback}")
        if not maximum >= 0:
            raise ValueError(f"maximum must be a non-negative number of seconds, got {maximum}")
        self.fallback = fallback
        self.maximum = float(maximum)

    def __call__(self, retry_state: Any) -> float:
        delay = retry_after(_failure(retry_state))
        if delay is None:
            fallback = self.fallback
            delay = float(fallback(retry_state) if callable(fallback) else fallback)
        return min(delay, self.maximum)

    def __repr__(self) -> str:
        return f"wait_retry_after(fallback={self.fallback!r}, maximum={self.maximum})"
