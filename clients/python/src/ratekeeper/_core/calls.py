"""What every SDK wrapper shares about a limited call, sans I/O.

The options every wrapper's `LimitOptions` starts with (`CallOptions`), what
one call acquires (`Cost`) and what it used (`Counts`), reading the
provider's rate-limit headers (`retry_delay`), when to forward them
(`FeedbackSampler`), and the check that the SDK client and the limiter are
of one kind (`is_async_sdk`). What a failed provider call leaves of its
lease is `failed_call`'s; the rule that waits is the gate's (`_async/gate.py`,
generated into `_sync/gate.py`).
"""

from __future__ import annotations

import contextlib
import email.utils
import inspect
import math
import random
import re
import time
from dataclasses import dataclass
from typing import Any, NamedTuple, Optional


@dataclass(frozen=True)
class CallOptions:
    """The fields every wrapper's `LimitOptions` starts with: which limit a
    wrapped client's calls acquire from, and how. Each wrapper's own fields
    (its retries, which differ in the answers they retry) follow them."""

    limit: str
    tenant: Optional[str] = None
    priority: Optional[str] = None
    #: Seconds an acquire may wait for its reservation (None: the class default).
    max_wait: Optional[float] = None


class Counts(NamedTuple):
    """The tokens an answer used, as the wrappers report them (`Lease.report`).

    The input is split as providers bill it: `input_tokens` is the full-price
    input only, apart from what was read from the prompt cache
    (`cached_input_tokens`) and written to it (`cache_write_tokens`).
    """

    input_tokens: int
    output_tokens: int
    cached_input_tokens: int = 0
    cache_write_tokens: int = 0


@dataclass(frozen=True)
class Cost:
    """What one call acquires: chat `messages` (with `tools`, and for Anthropic
    a top-level `system`) for the daemon to count, or `tokens` counted here;
    `max_tokens` of output on top (None: the limit's default)."""

    messages: Optional[list] = None
    tools: Any = None
    max_tokens: Optional[int] = None
    tokens: Optional[int] = None
    system: Any = None


_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")
_UNIT_SECONDS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}


def _parse_duration(text: str) -> Optional[float]:
    """OpenAI's reset durations: `"1s"`, `"6m0s"`, `"20ms"`, `"1h2m3.5s"`."""
    parts = _DURATION.findall(text.strip())
    if not parts or "".join(n + u for n, u in parts) != text.strip():
        return None
    return sum(float(number) * _UNIT_SECONDS[unit] for number, unit in parts)


def retry_delay(headers: Any, attempt: int, cap: float = 60.0) -> float:
    """Seconds to wait before retrying a 429, from the provider's headers.

    `retry-after-ms`, then `retry-after` (seconds or an HTTP date), then the
    latest of the `x-ratelimit-reset-*` durations; without any, exponential
    backoff from 0.5 s. Never more than `cap`, with up to 10 % jitter added.
    """
    headers = headers or {}
    delay: Optional[float] = None
    value = headers.get("retry-after-ms")
    if value is not None:
        with contextlib.suppress(ValueError):
            delay = float(value) / 1000.0
    value = headers.get("retry-after")
    if delay is None and value is not None:
        try:
            delay = float(value)
        except ValueError:
            try:
                when = email.utils.parsedate_to_datetime(value)
                delay = when.timestamp() - time.time()
            except (TypeError, ValueError):
                pass
    if delay is None:
        resets = [
            _parse_duration(headers.get(name) or "")
            for name in ("x-ratelimit-reset-requests", "x-ratelimit-reset-tokens")
        ]
        known = [reset for reset in resets if reset is not None]
        delay = max(known) if known else None
    if delay is None:
        delay = 0.5 * 2**attempt
    delay = min(max(delay, 0.0), cap)
    return delay * (1 + random.random() / 10)


class FeedbackSampler:
    """When a successful answer's headers are forwarded: at most once per `interval`.

    429s are always forwarded (while enabled). `interval=None` forwards
    nothing; `0` forwards every answer. Threads may race on a sample: at
    worst two answers go out in one interval, which is harmless.
    """

    def __init__(self, interval: Optional[float]) -> None:
        if interval is not None and (interval < 0 or math.isnan(interval)):
            raise ValueError(f"feedback_interval must be None or >= 0 seconds, got {interval}")
        self.interval = interval
        self._next = 0.0

    @property
    def enabled(self) -> bool:
        return self.interval is not None

    def disable(self) -> None:
        self.interval = None

    def due(self) -> bool:
        if self.interval is None:
            return False
        now = time.monotonic()
        if now < self._next:
            return False
        self._next = now + self.interval
        return True


def error_headers(error: BaseException) -> Any:
    """The headers of the answer a provider call failed with (None: no answer)."""
    return getattr(getattr(error, "response", None), "headers", None)


def is_async_sdk(create: Any, async_limiter: bool, async_sdk: str, sync_sdk: str) -> bool:
    """Whether the SDK client whose limited call is `create` is asyncio; a
    `TypeError` unless the limiter is the ratekeeper client of the same kind
    (`async_limiter`: it is an `AsyncClient`)."""
    is_async = inspect.iscoroutinefunction(inspect.unwrap(create))
    if is_async != async_limiter:
        raise TypeError(
            f"wrap an {async_sdk} with a ratekeeper.AsyncClient, "
            f"and an {sync_sdk} with a ratekeeper.Client"
        )
    return is_async
