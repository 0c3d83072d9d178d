"""Rate-limit an OpenAI client's chat completions through the sidecar.

    import openai, ratekeeper
    from ratekeeper.openai import wrap

    llm = wrap(openai.OpenAI(), ratekeeper.Client(), limit="gpt-4o-mini")
    reply = llm.chat.completions.create(model="gpt-4o-mini", messages=[...], max_tokens=300)

Every `chat.completions.create` then acquires from the limit (the messages and
`max_tokens`), calls the provider, and reports the `usage` it answered, so the
unused part of the reservation goes back. Streams report when they end (the
wrapper asks for `stream_options={"include_usage": True}` and hides the extra
usage chunk from callers who did not ask for it). A 429 from the provider
(other applications on the same key) releases the lease, waits as long as the
provider's `retry-after` headers say (bounded), and tries again, up to
`max_retries` times. `ratekeeper.RateLimited` from the sidecar itself is not
retried: it reaches the caller, who can answer 503 with its `retry_after`.

Works with `openai.OpenAI` and `openai.AsyncOpenAI` (with `ratekeeper.Client`
and `ratekeeper.AsyncClient` respectively); everything other than
`chat.completions.create` passes through to the wrapped client. The wrapped
client's own retries are turned off (`max_retries=0`) for these calls, so that
429s are not retried behind the limiter's back; other errors propagate.

The daemon counts the messages with the limit's tokenizer. A daemon from
before token counting answers `Unsupported` to a messages cost; the wrapper
then falls back to a rough client-side estimate
(`ratekeeper.estimate_prompt_tokens`, about four characters a token) plus
`max_tokens`. The fallback is transitional and goes once such daemons are gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import inspect
import logging
import random
import re
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional, Union

from ._async import AsyncClient, AsyncLease
from ._core import estimate_prompt_tokens
from ._errors import RatekeeperError, Unsupported
from ._sync import Client, Lease

log = logging.getLogger("ratekeeper.openai")

__all__ = ["LimitOptions", "retry_delay", "wrap"]


@dataclass(frozen=True)
class LimitOptions:
    """How a wrapped client acquires, and how it retries provider 429s."""

    limit: str
    tenant: Optional[str] = None
    priority: Optional[str] = None
    #: Seconds an acquire may wait for its reservation (None: the class default).
    max_wait: Optional[float] = None
    #: Output tokens reserved when a request names no `max_tokens`. None: the
    #: daemon's default for the limit, or `FALLBACK_MAX_TOKENS` when the client
    #: has to estimate.
    default_max_tokens: Optional[int] = None
    #: Provider 429s retried per call before the error is raised.
    max_retries: int = 3
    #: Longest single wait for a 429, whatever the headers say.
    max_retry_wait: float = 60.0
    #: Client-side prompt estimate used while the daemon cannot count messages.
    estimate: Callable[..., int] = estimate_prompt_tokens


def wrap(
    client: Any,
    limiter: Union[Client, AsyncClient],
    limit: str,
    **options: Any,
) -> Any:
    """An OpenAI client whose chat completions are limited by `limiter` on `limit`.

    `options` are the fields of `LimitOptions`: `tenant`, `priority`,
    `max_wait`, `default_max_tokens`, `max_retries`, `max_retry_wait`.
    """
    settings = LimitOptions(limit=limit, **options)
    is_async = inspect.iscoroutinefunction(inspect.unwrap(client.chat.completions.create))
    if is_async != isinstance(limiter, AsyncClient):
        raise TypeError(
            "wrap an openai.AsyncOpenAI with a ratekeeper.AsyncClient, "
            "and an openai.OpenAI with a ratekeeper.Client"
        )
    return _Wrapped(client, limiter, settings, is_async)


# ---------------------------------------------------------------------------
# What the sync and asyncio paths share
# ---------------------------------------------------------------------------

#: Output tokens reserved by the client-side estimate when nothing says more.
FALLBACK_MAX_TOKENS = 1024

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


def _status(error: BaseException) -> Optional[int]:
    status = getattr(error, "status_code", None)
    return status if isinstance(status, int) else None


def _prepare(kwargs: dict) -> bool:
    """Asks a stream for its usage; True when the caller did not ask for it."""
    if kwargs.get("stream") is not True:
        return False
    stream_options = dict(kwargs.get("stream_options") or {})
    injected = "include_usage" not in stream_options
    stream_options.setdefault("include_usage", True)
    kwargs["stream_options"] = stream_options
    return injected


def _usage_counts(usage: Any) -> Optional[tuple[int, int]]:
    if usage is None:
        return None
    if isinstance(usage, dict):
        prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
    else:
        prompt = getattr(usage, "prompt_tokens", None)
        completion = getattr(usage, "completion_tokens", None)
    if prompt is None and completion is None:
        return None
    return int(prompt or 0), int(completion or 0)


def _cost(kwargs: dict) -> tuple[Any, Any, Optional[int]]:
    messages = kwargs.get("messages") or []
    tools = kwargs.get("tools") or kwargs.get("functions")
    max_tokens = kwargs.get("max_completion_tokens") or kwargs.get("max_tokens")
    return list(messages), tools, max_tokens


def _failure(error: BaseException) -> str:
    """What a failed provider call means for its lease.

    `"retry"`: a 429 — the request was refused, release and try again;
    `"release"`: another 4xx — refused, never processed; `"keep"`: anything
    else (5xx, timeouts, broken connections) — it may have been processed,
    so the reservation is kept.
    """
    status = _status(error)
    if status == 429:
        return "retry"
    if status is not None and 400 <= status < 500:
        return "release"
    return "keep"


def _log_settle_error(lease: Any, error: RatekeeperError) -> None:
    log.warning("could not settle lease %s: %s", lease.lease_id, error)


# ---------------------------------------------------------------------------
# The wrapper objects
# ---------------------------------------------------------------------------


class _Wrapped:
    """The wrapped client: `chat.completions.create` is limited, the rest passes through."""

    def __init__(self, client: Any, limiter: Any, settings: LimitOptions, is_async: bool) -> None:
        self._client = client
        with_options = getattr(client, "with_options", None)
        self._raw = with_options(max_retries=0) if callable(with_options) else client
        self.limiter = limiter
        self.settings = settings
        self.chat = _Chat(self, is_async)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


class _Chat:
    def __init__(self, wrapped: _Wrapped, is_async: bool) -> None:
        self._wrapped = wrapped
        self.completions = (_AsyncCompletions if is_async else _Completions)(wrapped)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._wrapped._client.chat, name)


class _Completions:
    def __init__(self, wrapped: _Wrapped) -> None:
        self._wrapped = wrapped
        self._settings = wrapped.settings

    def __getattr__(self, name: str) -> Any:
        return getattr(self._wrapped._client.chat.completions, name)

    def _acquire(self, kwargs: dict) -> Lease:
        settings = self._settings
        limiter: Client = self._wrapped.limiter
        messages, tools, max_tokens = _cost(kwargs)
        max_tokens = max_tokens or settings.default_max_tokens
        common = {
            "tenant": settings.tenant,
            "priority": settings.priority,
            "max_wait": settings.max_wait,
        }
        try:
            return limiter.acquire(
                settings.limit, messages=messages, max_tokens=max_tokens, tools=tools, **common
            )
        except Unsupported:  # transitional: a daemon from before token counting
            prompt = settings.estimate(messages, tools)
            output = max_tokens or FALLBACK_MAX_TOKENS
            return limiter.acquire(settings.limit, prompt, max_tokens=output, **common)

    def create(self, **kwargs: Any) -> Any:
        """`chat.completions.create`, limited: acquire, call, report the usage."""
        hide_usage = _prepare(kwargs)
        settings = self._settings
        attempt = 0
        while True:
            lease = self._acquire(kwargs)
            try:
                result = self._wrapped._raw.chat.completions.create(**kwargs)
            except BaseException as error:
                outcome = _failure(error)
                _settle_failed(lease, outcome)
                if outcome != "retry" or attempt >= settings.max_retries:
                    raise
                headers = getattr(getattr(error, "response", None), "headers", None)
                delay = retry_delay(headers, attempt, settings.max_retry_wait)
                log.info("provider answered 429; retrying in %.3fs", delay)
                time.sleep(delay)
                attempt += 1
                continue
            if kwargs.get("stream") is True:
                return _LimitedStream(result, lease, hide_usage)
            _report(lease, getattr(result, "usage", None))
            return result


def _settle_failed(lease: Lease, outcome: str) -> None:
    try:
        if outcome == "keep":
            lease.settle_as_reserved()
        else:
            lease.release()
    except RatekeeperError as error:
        _log_settle_error(lease, error)


def _report(lease: Lease, usage: Any) -> None:
    counts = _usage_counts(usage)
    try:
        if counts is None:
            lease.settle_as_reserved()  # no usage: count the reservation as spent
        else:
            lease.report(input_tokens=counts[0], output_tokens=counts[1])
    except RatekeeperError as error:
        _log_settle_error(lease, error)


class _LimitedStream:
    """A provider stream that reports its usage to the lease when it ends.

    Iterate it to the end or close it (it is a context manager, like the
    stream it wraps); a stream abandoned half-way keeps its whole reservation.
    """

    def __init__(self, stream: Any, lease: Lease, hide_usage: bool) -> None:
        self._stream = stream
        self._iterator = iter(stream)
        self._lease = lease
        self._hide_usage = hide_usage
        self._usage: Any = None

    def __iter__(self) -> _LimitedStream:
        return self

    def __next__(self) -> Any:
        while True:
            try:
                chunk = next(self._iterator)
            except StopIteration:
                self._finish()
                raise
            except BaseException:
                self._finish()
                raise
            usage = getattr(chunk, "usage", None)
            if usage is not None:
                self._usage = usage
                if self._hide_usage and not getattr(chunk, "choices", None):
                    continue  # the usage-only chunk the caller did not ask for
            return chunk

    def _finish(self) -> None:
        if not self._lease.settled:
            _report(self._lease, self._usage)

    def close(self) -> None:
        try:
            self._stream.close()
        finally:
            self._finish()

    def __enter__(self) -> _LimitedStream:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


class _AsyncCompletions:
    def __init__(self, wrapped: _Wrapped) -> None:
        self._wrapped = wrapped
        self._settings = wrapped.settings

    def __getattr__(self, name: str) -> Any:
        return getattr(self._wrapped._client.chat.completions, name)

    async def _acquire(self, kwargs: dict) -> AsyncLease:
        settings = self._settings
        limiter: AsyncClient = self._wrapped.limiter
        messages, tools, max_tokens = _cost(kwargs)
        max_tokens = max_tokens or settings.default_max_tokens
        common = {
            "tenant": settings.tenant,
            "priority": settings.priority,
            "max_wait": settings.max_wait,
        }
        try:
            return await limiter.acquire(
                settings.limit, messages=messages, max_tokens=max_tokens, tools=tools, **common
            )
        except Unsupported:  # transitional: a daemon from before token counting
            prompt = settings.estimate(messages, tools)
            output = max_tokens or FALLBACK_MAX_TOKENS
            return await limiter.acquire(settings.limit, prompt, max_tokens=output, **common)

    async def create(self, **kwargs: Any) -> Any:
        """`chat.completions.create`, limited: acquire, call, report the usage."""
        hide_usage = _prepare(kwargs)
        settings = self._settings
        attempt = 0
        while True:
            lease = await self._acquire(kwargs)
            try:
                result = await self._wrapped._raw.chat.completions.create(**kwargs)
            except BaseException as error:
                outcome = _failure(error)
                await _settle_failed_async(lease, outcome)
                if outcome != "retry" or attempt >= settings.max_retries:
                    raise
                headers = getattr(getattr(error, "response", None), "headers", None)
                delay = retry_delay(headers, attempt, settings.max_retry_wait)
                log.info("provider answered 429; retrying in %.3fs", delay)
                await asyncio.sleep(delay)
                attempt += 1
                continue
            if kwargs.get("stream") is True:
                return _AsyncLimitedStream(result, lease, hide_usage)
            await _report_async(lease, getattr(result, "usage", None))
            return result


async def _settle_failed_async(lease: AsyncLease, outcome: str) -> None:
    try:
        if outcome == "keep":
            await lease.settle_as_reserved()
        else:
            await lease.release()
    except RatekeeperError as error:
        _log_settle_error(lease, error)


async def _report_async(lease: AsyncLease, usage: Any) -> None:
    counts = _usage_counts(usage)
    try:
        if counts is None:
            await lease.settle_as_reserved()
        else:
            await lease.report(input_tokens=counts[0], output_tokens=counts[1])
    except RatekeeperError as error:
        _log_settle_error(lease, error)


class _AsyncLimitedStream:
    """The asyncio twin of `_LimitedStream`: `async for`, `await close()`."""

    def __init__(self, stream: Any, lease: AsyncLease, hide_usage: bool) -> None:
        self._stream = stream
        self._iterator = stream.__aiter__()
        self._lease = lease
        self._hide_usage = hide_usage
        self._usage: Any = None

    def __aiter__(self) -> _AsyncLimitedStream:
        return self

    async def __anext__(self) -> Any:
        while True:
            try:
                chunk = await self._iterator.__anext__()
            except StopAsyncIteration:
                await self._finish()
                raise
            except BaseException:
                await self._finish()
                raise
            usage = getattr(chunk, "usage", None)
            if usage is not None:
                self._usage = usage
                if self._hide_usage and not getattr(chunk, "choices", None):
                    continue
            return chunk

    async def _finish(self) -> None:
        if not self._lease.settled:
            await _report_async(self._lease, self._usage)

    async def close(self) -> None:
        try:
            await self._stream.close()
        finally:
            await self._finish()

    async def __aenter__(self) -> _AsyncLimitedStream:
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)
