"""The OpenAI wrapper's limited calls, written once: acquire, call, settle, retry.

`AsyncCompletions.create` acquires from the limit, calls the provider, and
reports the usage it answered, then forwards the provider's rate-limit headers
to the sidecar (every 429, a sample of the other answers); a provider 429
releases the lease, waits as the headers say and tries again.
`AsyncLimitedStream` reports when its stream ends.

The wrapper's halves are written for asyncio, in `_openai_async.py`;
`scripts/unasync.py` generates the blocking `_openai_sync.py` from it (see
`_async.py`). Edit `_openai_async.py`, then run `python scripts/unasync.py` in
clients/python; a test fails while `_openai_sync.py` is stale.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from . import _openai_core as core
from ._errors import ErrorCode, RatekeeperError, Unsupported
from ._io_async import sleep

if TYPE_CHECKING:
    from ._async import AsyncClient, AsyncLease
    from .openai import _Wrapped


class AsyncCompletions:
    """`chat.completions` of a wrapped client: `create` is limited, the rest passes through."""

    def __init__(self, wrapped: _Wrapped) -> None:
        self._wrapped = wrapped
        self._settings = wrapped.settings
        self._sampler = core.FeedbackSampler(wrapped.settings.feedback_interval)

    def __getattr__(self, name: str) -> Any:
        if name in core.UNLIMITED_CHAT_CALLS:
            core.warn_unlimited(self._wrapped.warned, f"chat.completions.{name}")
        return getattr(self._wrapped._client.chat.completions, name)

    async def _acquire(self, kwargs: dict) -> AsyncLease:
        settings = self._settings
        limiter: AsyncClient = self._wrapped.limiter
        messages, tools, max_tokens = core.cost(kwargs)
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
            output = max_tokens or core.FALLBACK_MAX_TOKENS
            return await limiter.acquire(settings.limit, prompt, max_tokens=output, **common)

    async def create(self, **kwargs: Any) -> Any:
        """`chat.completions.create`, limited: acquire, call, report the usage."""
        hide_usage = core.prepare(kwargs)
        settings = self._settings
        attempt = 0
        while True:
            lease = await self._acquire(kwargs)
            try:
                result, headers = await self._call(kwargs)
            except BaseException as error:
                outcome = core.failure(error)
                await settle_failed(lease, outcome)
                if outcome != "retry":
                    raise
                headers = getattr(getattr(error, "response", None), "headers", None)
                paused = await self._forward(lease, 429, headers)
                if attempt >= settings.max_retries:
                    raise
                # Paused in the sidecar: the next acquire waits exactly as long.
                delay = (
                    0.0 if paused else core.retry_delay(headers, attempt, settings.max_retry_wait)
                )
                core.log.info("provider answered 429; retrying in %.3fs", delay)
                await sleep(delay)
                attempt += 1
                continue
            if kwargs.get("stream") is True:
                return AsyncLimitedStream(result, lease, hide_usage, self, headers)
            await _report(lease, getattr(result, "usage", None))
            await self._forward(lease, 200, headers)
            return result

    async def _call(self, kwargs: dict) -> tuple[Any, Any]:
        """The provider's answer, with its headers when a sample is due (else None)."""
        completions = self._wrapped._raw.chat.completions
        raw_response = getattr(completions, "with_raw_response", None)
        if raw_response is None or not self._sampler.due():
            return await completions.create(**kwargs), None
        answer = await raw_response.create(**kwargs)
        return answer.parse(), answer.headers

    async def _forward(self, lease: AsyncLease, status: int, headers: Any) -> bool:
        """Forwards an answer's rate-limit headers; True if the sidecar paused the limit."""
        return await forward_feedback(self._sampler, lease, status, headers)


async def forward_feedback(
    sampler: core.FeedbackSampler, lease: AsyncLease, status: int, headers: Any
) -> bool:
    """Forwards an answer's rate-limit headers through `lease` (every wrapper's rule);
    True if the sidecar paused the limit."""
    if headers is None or not sampler.enabled or lease.unlimited:
        return False
    try:
        noted = await lease.feedback(status, headers)
    except RatekeeperError as error:
        if error.code == ErrorCode.UNSUPPORTED:  # a daemon from before feedback
            sampler.disable()
        core.log.info("could not forward the provider's headers: %s", error)
        return False
    return noted is not None and noted.paused_ms > 0


async def settle_failed(lease: AsyncLease, outcome: str) -> None:
    """Keeps the reservation (settled as fully used) or releases it, as `failure` said."""
    try:
        if outcome == "keep":
            await lease.settle_as_reserved()
        else:
            await lease.release()
    except RatekeeperError as error:
        core.log_settle_error(lease, error)


async def _report(lease: AsyncLease, usage: Any) -> None:
    """Settles with the provider's usage; without one, the reservation counts as spent."""
    counts = core.usage_counts(usage)
    try:
        if counts is None:
            await lease.settle_as_reserved()
        else:
            await lease.report(input_tokens=counts[0], output_tokens=counts[1])
    except RatekeeperError as error:
        core.log_settle_error(lease, error)


class AsyncLimitedStream:
    """A provider stream that reports its usage to the lease when it ends.

    Iterate it to the end or close it (it is a context manager, like the
    stream it wraps); a stream abandoned half-way keeps its whole reservation.
    """

    def __init__(
        self,
        stream: Any,
        lease: AsyncLease,
        hide_usage: bool,
        completions: AsyncCompletions,
        headers: Any,
    ) -> None:
        self._stream = stream
        self._iterator = stream.__aiter__()
        self._lease = lease
        self._hide_usage = hide_usage
        self._usage: Any = None
        self._completions = completions
        self._headers = headers

    def __aiter__(self) -> AsyncLimitedStream:
        return self

    async def __anext__(self) -> Any:
        while True:
            try:
                chunk = await self._iterator.__anext__()
            except BaseException:  # the end of the stream, or a failure
                await self._finish()
                raise
            usage = getattr(chunk, "usage", None)
            if usage is not None:
                self._usage = usage
                if self._hide_usage and not getattr(chunk, "choices", None):
                    continue  # the usage-only chunk the caller did not ask for
            return chunk

    async def _finish(self) -> None:
        if not self._lease.settled:
            await _report(self._lease, self._usage)
            await self._completions._forward(self._lease, 200, self._headers)

    async def close(self) -> None:
        """Closes the provider's stream and settles the lease."""
        try:
            await self._stream.close()
        finally:
            await self._finish()

    async def __aenter__(self) -> AsyncLimitedStream:
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)
