"""The Anthropic wrapper's limited calls, written once: acquire, call, settle, retry.

`AsyncMessages` is `messages` of a wrapped client, or `beta.messages` (its
`core.Endpoint` says which). Its `create` and `parse` acquire from the limit
by the request's messages (`system`, content blocks, `tools`; `max_tokens`
as the output), call the provider, and report the usage it answered: input
`input_tokens + cache_creation_input_tokens`, output `output_tokens`. A 429
keeps the request and its input spent (`AsyncLease.settle_as_rejected`: a
rate limiter counts what it refuses), a 529 (overloaded) releases the
lease; either is forwarded to the sidecar, waited out as `retry-after` says
and tried again with a new acquire. `AsyncMessages.stream` does the same
around the SDK's stream manager, settling when the stream is left;
`AsyncLimitedEvents` settles a `create(stream=True)` stream when it ends.

The same calls are limited under `with_raw_response` (`_raw`: the SDK's raw
answer, settled from its parsed usage, its headers always forwarded; a
stream's `parse()` gives events that settle at their end) and
`with_streaming_response` (`_streaming`: a context manager that settles
when it is left, from what the caller read through `AsyncLimitedResponse`,
else as reserved); `_core.wrapping.LimitedView`, which the OpenAI wrapper's
resources share, routes those views to them, and warns once for what spends
tokens unlimited (`batches`, ...); the rest passes through to the SDK.
`AsyncWrapped` is the wrapped client that `ratekeeper.anthropic.wrap` returns.

Written for asyncio; `scripts/unasync.py` generates `_sync/anthropic.py`
from it (see `client.py`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

from .._core import anthropic as core
from .._core.calls import Cost, Counts
from .._core.wrapping import LimitedView, WrappedClient, WrappedNamespace
from .gate import AsyncGate, AsyncStreamProxy

if TYPE_CHECKING:
    from .client import AsyncClient
    from .lease import AsyncLease


class AsyncMessagesGate(AsyncGate):
    """The Anthropic wrapper's gate (acquire, call, settle, forward, retry: every
    wrapper's rule, `gate.py`): the cost is the request's, in Anthropic's
    shape, and a 529 (overloaded) is retried as a 429 is. One per wrapped
    client, shared by `messages` and `beta.messages`."""

    retried = core.RETRIED
    log = core.log

    async def acquire(self, cost: Cost) -> AsyncLease:
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

    async def settle_stream(
        self, lease: AsyncLease, counts: Optional[Counts], stream: Any, headers: Any
    ) -> None:
        """Settles a stream's lease, forwarding `headers` (None: its response's
        headers when a sample is due)."""
        if headers is None and self.sampler.due():
            headers = getattr(getattr(stream, "response", None), "headers", None)
        await self.settle(lease, counts, headers)


class AsyncMessages(LimitedView):
    """`messages` (or `beta.messages`) of a wrapped client: `create`, `parse` and
    `stream` are limited, also under `with_raw_response` and
    `with_streaming_response`; what spends tokens unlimited warns once; the
    rest passes."""

    _gate: AsyncMessagesGate

    def __init__(self, wrapped: AsyncWrapped, endpoint: core.Endpoint = core.MESSAGES) -> None:
        super().__init__(wrapped, endpoint)

    async def _limited(self, kwargs: dict, call: Any) -> tuple[Any, AsyncLease]:
        """Acquires and makes `call()`; a 429 or 529 is settled, forwarded, waited out, retried."""
        return await self._gate.limited(core.cost(kwargs), call)

    async def create(self, **kwargs: Any) -> Any:
        """`messages.create`, limited: acquire, call, report the usage (a stream: at its end)."""
        return await self._create("create", kwargs)

    async def parse(self, **kwargs: Any) -> Any:
        """`messages.parse`, limited as `create`."""
        return await self._create("parse", kwargs)

    async def _create(self, method: str, kwargs: dict) -> Any:
        """`method` limited: acquire, call, report the usage, with the answer's
        headers when a sample is due."""
        sdk = self._sdk(self._wrapped._raw)
        stream = kwargs.get("stream") is True
        raw: Any = getattr(sdk.with_raw_response, method, None)  # `messages` has no raw `parse`
        sample = not stream and raw is not None and self._gate.sampler.due()

        async def call() -> Any:
            if sample:
                return await raw(**kwargs)
            return await getattr(sdk, method)(**kwargs)

        result, lease = await self._limited(kwargs, call)
        if stream:
            return AsyncLimitedEvents(result, lease, self._gate)
        headers = None
        if sample:
            headers = result.headers
            result = await result.parse()
        await self._gate.settle(lease, core.reply_counts(result), headers)
        return result

    async def _raw(self, method: str, /, **kwargs: Any) -> Any:
        """`with_raw_response.<method>` limited: the SDK's raw answer, settled from
        its parsed usage and its headers forwarded; for a stream, one whose
        `parse()` gives events that settle at their end."""
        create = getattr(self._sdk(self._wrapped._raw).with_raw_response, method)

        async def call() -> Any:
            return await create(**kwargs)

        answer, lease = await self._limited(kwargs, call)
        if kwargs.get("stream") is True:
            return AsyncLimitedResponse(answer, lease, self._gate, True, True)
        parsed = await answer.parse()
        await self._gate.settle(lease, core.reply_counts(parsed), answer.headers)
        return answer

    def _streaming(self, method: str, /, **kwargs: Any) -> AsyncLimitedResponseContext:
        """`with_streaming_response.<method>(...)` limited: settles when it is left."""
        return AsyncLimitedResponseContext(self, method, **kwargs)

    def stream(self, **kwargs: Any) -> AsyncLimitedStreamManager:
        """`messages.stream`, limited: acquires on entering, settles on leaving."""
        return AsyncLimitedStreamManager(self, kwargs)


class AsyncLimitedResponseContext:
    """`with_streaming_response.<method>(...)` of a wrapped `messages`, used as
    the SDK's: `async with ... as response:`. Entering acquires and makes the
    call (retrying a 429 or 529); leaving closes the response and settles from
    what the caller read through it (`parse()`, `json()`, `read()`, `text()`,
    a parsed stream's events), else as reserved. Its headers are always
    forwarded."""

    def __init__(self, messages: AsyncMessages, method: str, /, **kwargs: Any) -> None:
        self._messages = messages
        self._method = method
        self._kwargs = kwargs
        self._manager: Any = None
        self._response: Optional[AsyncLimitedResponse] = None

    async def __aenter__(self) -> Any:
        messages = self._messages
        kwargs = self._kwargs
        sdk = messages._sdk(messages._wrapped._raw)
        create = getattr(sdk.with_streaming_response, self._method)

        async def call() -> tuple[Any, Any]:
            manager = create(**kwargs)
            return manager, await manager.__aenter__()

        (self._manager, response), lease = await messages._limited(kwargs, call)
        stream = kwargs.get("stream") is True
        self._response = AsyncLimitedResponse(response, lease, messages._gate, stream, False)
        return self._response

    async def __aexit__(self, *exc_info: Any) -> None:
        try:
            await self._manager.__aexit__(*exc_info)
        finally:
            if self._response is not None:
                await self._response.finish()


class AsyncLimitedResponse:
    """The SDK's response of a limited `with_streaming_response` call (or of a
    `with_raw_response` stream), seen by the wrapper: the usage of what is read
    through `parse()`, `json()`, `read()` and `text()` is noted, and a parsed
    stream settles at its end; everything else is the SDK's. A raw answer
    (`raw`), which no `with` block closes, settles as soon as it is read."""

    def __init__(
        self, response: Any, lease: AsyncLease, gate: AsyncMessagesGate, stream: bool, raw: bool
    ) -> None:
        self._response = response
        self._lease = lease
        self._gate = gate
        self._is_stream = stream
        self._is_raw = raw
        self._counts: Optional[Counts] = None
        self._events: Optional[AsyncLimitedEvents] = None

    async def parse(self, **options: Any) -> Any:
        """The SDK's `parse()`; a stream comes back as events that settle at their end."""
        parsed = await self._response.parse(**options)
        if not self._is_stream:
            await self._read(core.reply_counts(parsed))
            return parsed
        if options:  # parsed `to=` a type of the caller's: its usage is not seen
            return parsed
        if self._events is None:
            headers = self._response.headers
            self._events = AsyncLimitedEvents(parsed, self._lease, self._gate, headers)
        return self._events

    async def json(self) -> Any:
        body = await self._response.json()
        await self._read(core.reply_counts(body))
        return body

    async def read(self) -> bytes:
        body = await self._response.read()
        await self._read(core.body_counts(body, self._lease.reserved.output_tokens))
        return body

    async def text(self) -> str:
        body = await self._response.text()
        await self._read(core.body_counts(body, self._lease.reserved.output_tokens))
        return body

    async def _read(self, counts: Optional[Counts]) -> None:
        """Notes the usage of what was read; a raw answer settles with it."""
        self._counts = counts
        if self._is_raw:
            await self.finish()

    async def finish(self) -> None:
        """Settles the lease from what was read (nothing: as reserved)."""
        if self._events is not None:
            await self._events.finish()
        elif not self._lease.settled:
            headers = self._response.headers
            await self._gate.settle(self._lease, self._counts, headers)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._response, name)


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
        sdk = self._messages._sdk(self._messages._wrapped._raw)
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
            await self._messages._gate.settle_stream(lease, counts, self._stream, None)


class AsyncLimitedEvents(AsyncStreamProxy):
    """A `messages.create(stream=True)` stream that reports its usage when it ends.

    Iterate it to the end or close it (it is a context manager, like the
    stream it wraps); a stream left half-way reports its input and keeps its
    reserved output. `headers` are forwarded when it settles (None: its
    response's, when a sample is due).
    """

    def __init__(
        self,
        stream: Any,
        lease: AsyncLease,
        gate: AsyncMessagesGate,
        headers: Any = None,
    ) -> None:
        self._stream = stream
        self._iterator = stream.__aiter__()
        self._lease = lease
        self._usage = core.StreamUsage()
        self._gate = gate
        self._headers = headers

    def __aiter__(self) -> AsyncLimitedEvents:
        return self

    async def __anext__(self) -> Any:
        try:
            event = await self._iterator.__anext__()
        except BaseException:  # the end of the stream, or a failure
            await self.finish()
            raise
        self._usage.add(event)
        return event

    async def finish(self) -> None:
        """Settles the lease with the usage seen so far (the reserved output if none)."""
        lease = self._lease
        if not lease.settled:
            counts = self._usage.counts(lease.reserved.output_tokens)
            await self._gate.settle_stream(lease, counts, self._stream, self._headers)

    _finish = finish  # what `close` does once the stream is closed


class AsyncWrapped(WrappedClient):
    """A wrapped Anthropic client: `messages` and `beta.messages` are limited,
    the rest passes through (what spends tokens there warns once)."""

    provider = "Anthropic"
    unlimited = core.UNLIMITED_SPENDERS

    def __init__(
        self,
        client: Any,
        limiter: AsyncClient,
        settings: Any,
        warned: Optional[set] = None,
    ) -> None:
        super().__init__(client, limiter, settings, warned)
        #: Shared by both `messages`.
        self.gate = AsyncMessagesGate(limiter, settings)
        self.messages = AsyncMessages(self)
        beta_messages = AsyncMessages(self, core.BETA_MESSAGES)
        self.beta = WrappedNamespace(
            self, "beta", core.UNLIMITED_BETA_PARTS, messages=beta_messages
        )
