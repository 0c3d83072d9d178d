"""The Anthropic wrapper's limited calls, written once: acquire, call, settle, retry.

`AsyncMessages.create` acquires from the limit by the request's messages
(`system`, content blocks, `tools`; `max_tokens` as the output), calls the
provider, and reports the usage it answered: input `input_tokens +
cache_creation_input_tokens`, output `output_tokens`. A 429 keeps the
request and its input spent (`AsyncLease.settle_as_rejected`: a rate
limiter counts what it refuses), a 529 (overloaded) releases the lease;
either is forwarded to the sidecar, waited out as `retry-after` says and
tried again with a new acquire. `AsyncMessages.stream` does the same
around the SDK's stream manager,
settling when the stream is left; `AsyncLimitedEvents` settles a
`create(stream=True)` stream when it ends.

Written for asyncio; `scripts/unasync.py` generates the blocking
`_anthropic_sync.py` from it (see `_async.py`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from . import _anthropic_core as core
from . import _openai_calls as calls
from ._openai_async import AsyncGate, AsyncStreamProxy

if TYPE_CHECKING:
    from ._async import AsyncLease
    from .anthropic import _Wrapped


class AsyncMessagesGate(AsyncGate):
    """The OpenAI wrapper's gate (acquire, call, settle, forward, retry) for
    `messages`: the cost is the request's, in Anthropic's shape, and a 529
    (overloaded) is retried as a 429 is."""

    retried = core.RETRIED
    log = core.log

    async def acquire(self, cost: calls.Cost) -> AsyncLease:
        settings = self.settings
        return await self.limiter.acquire(
            settings.limit,
            messages=cost.messages,
            system=cost.system,
            tools=cost.tools,
            max_tokens=cost.max_tokens,
            api="anthropic",
            tenant=settings.tenant,
            priority=settings.priority,
            max_wait=settings.max_wait,
        )


class AsyncMessages:
    """`messages` of a wrapped client: `create` and `stream` are limited; the rest passes."""

    def __init__(self, wrapped: _Wrapped) -> None:
        self._wrapped = wrapped
        self._gate = AsyncMessagesGate(wrapped.limiter, wrapped.settings)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._wrapped._client.messages, name)

    async def _limited(self, kwargs: dict, call: Any) -> tuple[Any, AsyncLease]:
        """Acquires and makes `call()`; a 429 or 529 is settled, forwarded, waited out, retried."""
        return await self._gate.limited(core.cost(kwargs), call)

    async def create(self, **kwargs: Any) -> Any:
        """`messages.create`, limited: acquire, call, report the usage."""
        messages = self._wrapped._raw.messages
        sample = not kwargs.get("stream") and self._gate.sampler.due()

        async def call() -> Any:
            if sample:
                return await messages.with_raw_response.create(**kwargs)
            return await messages.create(**kwargs)

        result, lease = await self._limited(kwargs, call)
        if kwargs.get("stream") is True:
            return AsyncLimitedEvents(result, lease, self)
        headers = None
        if sample:
            headers = result.headers
            result = await result.parse()
        await self._gate.settle(lease, core.usage_counts(getattr(result, "usage", None)), headers)
        return result

    def stream(self, **kwargs: Any) -> AsyncLimitedStreamManager:
        """`messages.stream`, limited: acquires on entering, settles on leaving."""
        return AsyncLimitedStreamManager(self, kwargs)

    async def _settle_stream(self, lease: AsyncLease, counts: Any, stream: Any) -> None:
        """Settles a stream's lease, forwarding its response headers when a sample is due."""
        due = self._gate.sampler.due()
        headers = getattr(getattr(stream, "response", None), "headers", None) if due else None
        await self._gate.settle(lease, counts, headers)


class AsyncLimitedStreamManager:
    """`messages.stream(...)` of a wrapped client, used as the SDK's:
    `async with client.messages.stream(...) as stream:`.

    Entering acquires, opens the SDK's stream (retrying a 429 or 529) and
    gives the SDK's own stream object; leaving closes it and reports the
    usage of its message snapshot (an unfinished stream keeps its reserved
    output).
    """

    def __init__(self, messages: AsyncMessages, kwargs: dict) -> None:
        self._messages = messages
        self._kwargs = kwargs
        self._manager: Any = None
        self._stream: Any = None
        self._lease: Any = None

    async def __aenter__(self) -> Any:
        sdk = self._messages._wrapped._raw.messages
        kwargs = self._kwargs

        async def call() -> Any:
            manager = sdk.stream(**kwargs)
            return manager, await manager.__aenter__()

        (self._manager, self._stream), self._lease = await self._messages._limited(kwargs, call)
        return self._stream

    async def __aexit__(self, *exc_info: Any) -> None:
        try:
            await self._manager.__aexit__(*exc_info)
        finally:
            lease = self._lease
            counts = core.snapshot_counts(self._stream, lease.reserved.output_tokens)
            await self._messages._settle_stream(lease, counts, self._stream)


class AsyncLimitedEvents(AsyncStreamProxy):
    """A `messages.create(stream=True)` stream that reports its usage when it ends.

    Iterate it to the end or close it (it is a context manager, like the
    stream it wraps); a stream left half-way reports its input and keeps its
    reserved output.
    """

    def __init__(self, stream: Any, lease: AsyncLease, messages: AsyncMessages) -> None:
        self._stream = stream
        self._iterator = stream.__aiter__()
        self._lease = lease
        self._usage = core.StreamUsage()
        self._messages = messages

    def __aiter__(self) -> AsyncLimitedEvents:
        return self

    async def __anext__(self) -> Any:
        try:
            event = await self._iterator.__anext__()
        except BaseException:  # the end of the stream, or a failure
            await self._finish()
            raise
        self._usage.add(event)
        return event

    async def _finish(self) -> None:
        """Settles the lease with the usage seen so far (the reserved output if none)."""
        lease = self._lease
        if not lease.settled:
            counts = self._usage.counts(lease.reserved.output_tokens)
            await self._messages._settle_stream(lease, counts, self._stream)
