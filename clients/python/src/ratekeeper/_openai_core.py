"""What both halves of the OpenAI wrapper share that never waits.

Reading the provider's rate-limit headers (`retry_delay`), when to forward
them (`FeedbackSampler`), which parts of the client spend tokens unlimited
(the warning is `_wrapping`'s, shared with the Anthropic wrapper), and the
options every wrapper's `LimitOptions` starts with (`CallOptions`; the
Anthropic wrapper uses this module too). What a failed provider call
leaves of its lease is the client's rule (`_core.failed_call`, applied by
`AsyncLease.settle_failed`). What each limited call
costs and used is in `_openai_calls.py`; the halves that do wait are written
once in `_openai_async.py` and `_openai_resources_async.py`, and the blocking
ones are generated from them.
"""

from __future__ import annotations

import contextlib
import email.utils
import inspect
import logging
import math
import random
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Optional

from ._async import AsyncClient
from ._proto.errors import RatekeeperError
from ._requests import MessageLike, _json_text, chat_message

log = logging.getLogger("ratekeeper.openai")

#: Output tokens reserved by the client-side estimate when nothing says more.
FALLBACK_MAX_TOKENS = 1024


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


def log_settle_error(lease: Any, error: RatekeeperError) -> None:
    log.warning("could not settle lease %s: %s", lease.lease_id, error)


def estimate_prompt_tokens(messages: Iterable[MessageLike], tools: Any = None) -> int:
    """A rough client-side count of a chat request's prompt: about 4 characters a token.

    Used by the OpenAI wrapper when a daemon from before token counting answers
    `Unsupported` to message costs; it is no tokenizer.
    """
    total = 3  # every reply is primed with a few tokens
    for message in messages:
        chat = chat_message(message)
        text = sum(len(part) for part in chat.content)
        text += len(chat.name or "") + len(chat.tool_calls_json or "")
        total += 4 + math.ceil(text / 4)
    tools_json = _json_text(tools) if tools else None
    if tools_json:
        total += math.ceil(len(tools_json) / 4)
    return total


#: Parts of the OpenAI client that spend tokens but pass through the wrapper
#: unlimited: reaching one warns (once per wrapped client and name). The
#: client-wide `with_raw_response` / `with_streaming_response` reach every
#: resource unlimited; the wrapped resources have their own.
UNLIMITED_SPENDERS = frozenset(
    {
        "completions",
        "images",
        "audio",
        "beta",
        "batches",
        "realtime",
        "with_raw_response",
        "with_streaming_response",
    }
)
#: The same for `chat`: its own raw and streaming views reach `completions` unlimited.
UNLIMITED_CHAT_PARTS = frozenset({"with_raw_response", "with_streaming_response"})


def is_async_sdk(create: Any, limiter: Any, async_sdk: str, sync_sdk: str) -> bool:
    """Whether the SDK client whose limited call is `create` is asyncio; a
    `TypeError` unless `limiter` is the ratekeeper client of the same kind."""
    is_async = inspect.iscoroutinefunction(inspect.unwrap(create))
    if is_async != isinstance(limiter, AsyncClient):
        raise TypeError(
            f"wrap an {async_sdk} with a ratekeeper.AsyncClient, "
            f"and an {sync_sdk} with a ratekeeper.Client"
        )
    return is_async


class RawStreamResponse:
    """A stream's raw answer (`with_raw_response.create(stream=True)`) whose
    `parse()` gives the wrapper's stream, which settles at its end, instead of
    the SDK's; everything else (`headers`, `http_response`, ...) is the SDK's."""

    def __init__(self, response: Any, stream: Any) -> None:
        self._response = response
        self._stream = stream

    def parse(self, *, to: Any = None) -> Any:
        if to is None:
            return self._stream
        return self._response.parse(to=to)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._response, name)
