"""The OpenAI wrapper's limited calls, written once: each way of calling them.

`AsyncOpenAIGate` is the gate (`gate.py`) of a wrapped OpenAI client: it
acquires a call's cost as the daemon counts it, or by the client-side
estimate while the daemon cannot count messages. `AsyncCompletions`
(`chat.completions`), `AsyncResponses` (`responses`) and `AsyncEmbeddings`
(`embeddings`) limit `create` (and `parse`) through it, by the cost
`_core/openai.py` reads from the request, and settle from the usage of the
answer, or of a stream's events when it ends (`AsyncLimitedStream`). The same
calls are limited under `with_raw_response` (the raw answer; its headers
always forwarded) and `with_streaming_response` (settled when its `with`
block is left, from what the caller read), and the SDK's `stream()` helpers
settle when their `with` block is left. Everything else passes through to
the SDK; what spends tokens there warns once. `AsyncWrapped` is the wrapped
client that `ratekeeper.openai.wrap` returns.

Written for asyncio; `scripts/unasync.py` generates `_sync/openai.py` from
it (see `client.py`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

from .._core import openai as calls
from .._core.calls import Cost, Counts
from .._core.estimate import FALLBACK_MAX_TOKENS
from .._core.wrapping import LimitedView, WrappedClient, WrappedNamespace
from .._proto.errors import Unsupported
from .gate import AsyncGate, AsyncStreamProxy

if TYPE_CHECKING:
    from .client import AsyncClient
    from .lease import AsyncLease


class AsyncOpenAIGate(AsyncGate):
    """The OpenAI wrapper's gate: a 429 is retried, with an acquire of its own."""

    log = calls.log

    async def acquire(self, cost: Cost) -> AsyncLease:
        """A lease for `cost`: counted by the daemon, or by a rough client-side
        estimate while the daemon cannot count messages."""
        settings = self.settings
        limiter = self.limiter
        max_tokens = cost.max_tokens
        if max_tokens is None:
            max_tokens = settings.default_max_tokens
        common: dict[str, Any] = {
            "tenant": settings.tenant,
            "priority": settings.priority,
            "max_wait": settings.max_wait,
        }
        tokens = cost.tokens
        if tokens is not None:
            return await limiter.acquire(settings.limit, tokens, max_tokens=max_tokens, **common)
        messages = cost.messages or []
        try:
            return await limiter.acquire(
                settings.limit, messages=messages, max_tokens=max_tokens, tools=cost.tools, **common
            )
        except Unsupported:  # transitional: a daemon from before token counting
            prompt = settings.estimate(messages, cost.tools)
            output = FALLBACK_MAX_TOKENS if max_tokens is None else max_tokens
            return await limiter.acquire(settings.limit, prompt, max_tokens=output, **common)


class AsyncLimitedStream(AsyncStreamProxy):
    """A provider stream that reports its usage to the lease when it ends.

    Iterate it to the end or close it (it is a context manager, like the
    stream it wraps); a stream abandoned half-way keeps its whole reservation.
    The usage chunk the wrapper asked for is hidden from a caller who did not.
    """

    def __init__(
        self,
        stream: Any,
        lease: AsyncLease,
        api: calls.Api,
        hide_usage: bool,
        gate: AsyncOpenAIGate,
        headers: Any,
    ) -> None:
        self._stream = stream
        self._iterator = stream.__aiter__()
        self._lease = lease
        self._api = api
        self._hide_usage = hide_usage
        self._usage: Any = None
        self._gate = gate
        self._headers = headers

    def __aiter__(self) -> AsyncLimitedStream:
        return self

    async def __anext__(self) -> Any:
        while True:
            try:
                event = await self._iterator.__anext__()
            except BaseException:  # the end of the stream, or a failure
                await self.finish()
                raise
            usage = self._api.event_usage(event)
            if usage is not None:
                self._usage = usage
            if self._hide_usage and self._api.usage_only(event):
                continue  # the usage-only chunk the caller did not ask for
            return event

    async def finish(self) -> None:
        """Settles the lease with the usage seen so far (none: as reserved)."""
        if not self._lease.settled:
            await self._gate.settle(self._lease, self._api.counts(self._usage), self._headers)

    _finish = finish  # what `close` does once the stream is closed


class AsyncResource(LimitedView):
    """An SDK resource whose `api.methods` are limited; the rest passes through."""

    #: The endpoint: its cost, usage and limited methods (set by each subclass).
    api: calls.Api
    _gate: AsyncOpenAIGate

    def __init__(self, wrapped: AsyncWrapped) -> None:
        super().__init__(wrapped, self.api)

    async def _create(self, method: str, kwargs: dict) -> Any:
        """`method` limited: acquire, call, report the usage (a stream: at its end)."""
        api = self.api
        gate = self._gate
        hide_usage = api.prepare(kwargs)
        sdk = self._sdk(self._wrapped._raw)

        async def call() -> tuple[Any, Any]:
            """The answer, with its headers when a sample is due (else None)."""
            if not gate.sampler.due():
                return await getattr(sdk, method)(**kwargs), None
            answer = await getattr(sdk.with_raw_response, method)(**kwargs)
            return answer.parse(), answer.headers

        (result, headers), lease = await gate.limited(api.cost(kwargs), call)
        if kwargs.get("stream") is True:
            return AsyncLimitedStream(result, lease, api, hide_usage, gate, headers)
        await gate.settle(lease, api.reply_counts(result), headers)
        return result

    async def _raw(self, method: str, /, **kwargs: Any) -> Any:
        """`with_raw_response.<method>` limited; the SDK's raw answer, or for a
        stream one whose `parse()` gives a stream that settles at its end."""
        api = self.api
        gate = self._gate
        hide_usage = api.prepare(kwargs)
        create = getattr(self._sdk(self._wrapped._raw).with_raw_response, method)

        async def call() -> Any:
            return await create(**kwargs)

        answer, lease = await gate.limited(api.cost(kwargs), call)
        if kwargs.get("stream") is True:
            parsed, headers = answer.parse(), answer.headers
            stream = AsyncLimitedStream(parsed, lease, api, hide_usage, gate, headers)
            return calls.RawStreamResponse(answer, stream)
        await gate.settle(lease, api.reply_counts(answer.parse()), answer.headers)
        return answer

    def _streaming(self, method: str, /, **kwargs: Any) -> AsyncLimitedResponseContext:
        """`with_streaming_response.<method>(...)` limited: settles when it is left."""
        return AsyncLimitedResponseContext(self, method, **kwargs)


class AsyncLimitedResponseContext:
    """`with_streaming_response.<method>(...)` of a limited resource, used as the
    SDK's: `async with ... as response:`. Entering acquires and makes the call
    (retrying a 429); leaving closes the response and settles from what the
    caller read through it (`parse()`, `json()`, `read()`, `text()`, a parsed
    stream's events), else as reserved. Its headers are always forwarded."""

    def __init__(self, resource: AsyncResource, method: str, /, **kwargs: Any) -> None:
        self._resource = resource
        self._method = method
        self._kwargs = kwargs
        self._manager: Any = None
        self._response: Optional[AsyncLimitedResponse] = None

    async def __aenter__(self) -> Any:
        resource = self._resource
        api = resource.api
        kwargs = self._kwargs
        hide_usage = api.prepare(kwargs)
        sdk = resource._sdk(resource._wrapped._raw)
        create = getattr(sdk.with_streaming_response, self._method)

        async def call() -> tuple[Any, Any]:
            manager = create(**kwargs)
            return manager, await manager.__aenter__()

        (self._manager, response), lease = await resource._gate.limited(api.cost(kwargs), call)
        stream = kwargs.get("stream") is True
        self._response = AsyncLimitedResponse(response, lease, resource, hide_usage, stream)
        return self._response

    async def __aexit__(self, *exc_info: Any) -> None:
        try:
            await self._manager.__aexit__(*exc_info)
        finally:
            if self._response is not None:
                await self._response.finish()


class AsyncLimitedResponse:
    """The SDK's response of a `with_streaming_response` call, seen by the wrapper:
    the usage of what is read through `parse()`, `json()`, `read()` and
    `text()` is noted; everything else is the SDK's."""

    def __init__(
        self,
        response: Any,
        lease: AsyncLease,
        resource: AsyncResource,
        hide_usage: bool,
        stream: bool,
    ) -> None:
        self._response = response
        self._lease = lease
        self._resource = resource
        self._hide_usage = hide_usage
        self._is_stream = stream
        self._counts: Optional[Counts] = None
        self._stream: Optional[AsyncLimitedStream] = None

    async def parse(self, **options: Any) -> Any:
        """The SDK's `parse()`; a stream comes back as one that settles at its end."""
        parsed = await self._response.parse(**options)
        api = self._resource.api
        if not self._is_stream:
            self._counts = api.reply_counts(parsed)
            return parsed
        if self._stream is None:
            lease, hide_usage = self._lease, self._hide_usage
            gate, headers = self._resource._gate, self._response.headers
            self._stream = AsyncLimitedStream(parsed, lease, api, hide_usage, gate, headers)
        return self._stream

    async def json(self) -> Any:
        body = await self._response.json()
        self._counts = self._resource.api.reply_counts(body)
        return body

    async def read(self) -> bytes:
        body = await self._response.read()
        self._counts = self._resource.api.body_counts(body)
        return body

    async def text(self) -> str:
        body = await self._response.text()
        self._counts = self._resource.api.body_counts(body)
        return body

    async def finish(self) -> None:
        """Settles the lease from what was read (nothing: as reserved)."""
        if self._stream is not None:
            await self._stream.finish()
        elif not self._lease.settled:
            headers = self._response.headers
            await self._resource._gate.settle(self._lease, self._counts, headers)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._response, name)


class AsyncLimitedStreamManager:
    """`chat.completions.stream(...)` of a wrapped client, used as the SDK's:
    `async with ... as stream:`. Entering acquires and opens the SDK's stream
    (retrying a 429) and gives it; leaving closes it and settles from its
    snapshot's usage, which the last chunk carries (asked for with
    `stream_options.include_usage`): a stream left unfinished keeps its
    whole reservation."""

    def __init__(self, resource: AsyncResource, kwargs: dict[str, Any]) -> None:
        self._resource = resource
        self._kwargs = kwargs
        self._manager: Any = None
        self._stream: Any = None
        self._lease: Any = None

    async def __aenter__(self) -> Any:
        resource = self._resource
        kwargs = self._kwargs
        sdk = resource._sdk(resource._wrapped._raw)

        async def call() -> tuple[Any, Any]:
            manager = sdk.stream(**kwargs)
            return manager, await manager.__aenter__()

        cost = resource.api.cost(kwargs)
        (self._manager, stream), self._lease = await resource._gate.limited(cost, call)
        self._stream = self._observe(stream)
        return self._stream

    async def __aexit__(self, *exc_info: Any) -> None:
        try:
            await self._manager.__aexit__(*exc_info)
        finally:
            await self._resource._gate.settle(self._lease, self._counts(), None)

    def _observe(self, stream: Any) -> Any:
        return stream

    def _counts(self) -> Optional[Counts]:
        return calls.snapshot_counts(self._resource.api, self._stream)


class AsyncLimitedResponseStreamManager(AsyncLimitedStreamManager):
    """`responses.stream(...)` of a wrapped client, as `AsyncLimitedStreamManager`;
    the SDK's stream is seen through `AsyncObservedEvents` (it has no public
    snapshot), and settles from the final event's usage."""

    def _observe(self, stream: Any) -> Any:
        return AsyncObservedEvents(stream, self._resource.api)

    def _counts(self) -> Optional[Counts]:
        return self._resource.api.counts(self._stream.usage)


class AsyncObservedEvents(AsyncStreamProxy):
    """The SDK's `responses.stream()` stream, whose events the wrapper sees pass
    for the usage of the final one; its methods work as on the stream itself."""

    def __init__(self, stream: Any, api: calls.Api) -> None:
        self._stream = stream
        self._api = api
        #: The usage of the final event, once it passed.
        self.usage: Any = None

    def __aiter__(self) -> AsyncObservedEvents:
        return self

    async def __anext__(self) -> Any:
        event = await self._stream.__anext__()
        usage = self._api.event_usage(event)
        if usage is not None:
            self.usage = usage
        return event

    async def until_done(self) -> AsyncObservedEvents:
        """Reads the stream to its end."""
        async for _ in self:
            pass
        return self

    async def get_final_response(self) -> Any:
        """Reads the stream to its end and gives the SDK's final response."""
        await self.until_done()
        return await self._stream.get_final_response()


class AsyncCompletions(AsyncResource):
    """`chat.completions` of a wrapped client: `create`, `parse` and `stream` are limited."""

    api = calls.CHAT

    async def create(self, **kwargs: Any) -> Any:
        """`chat.completions.create`, limited: acquire, call, report the usage."""
        return await self._create("create", kwargs)

    async def parse(self, **kwargs: Any) -> Any:
        """`chat.completions.parse`, limited as `create`."""
        return await self._create("parse", kwargs)

    def stream(self, **kwargs: Any) -> AsyncLimitedStreamManager:
        """`chat.completions.stream`, limited: acquires on entering, settles on leaving."""
        calls.ask_for_usage(kwargs)
        return AsyncLimitedStreamManager(self, kwargs)


class AsyncResponses(AsyncResource):
    """`responses` of a wrapped client: `create`, `parse` and `stream` are limited."""

    api = calls.RESPONSES

    async def create(self, **kwargs: Any) -> Any:
        """`responses.create`, limited: acquire, call, report the usage."""
        return await self._create("create", kwargs)

    async def parse(self, **kwargs: Any) -> Any:
        """`responses.parse`, limited as `create`."""
        return await self._create("parse", kwargs)

    def stream(self, **kwargs: Any) -> Any:
        """`responses.stream`, limited: acquires on entering, settles on leaving.
        Streaming a response created before (`response_id=`) spends nothing new
        and passes through."""
        if "response_id" in kwargs:
            return self._sdk(self._wrapped._client).stream(**kwargs)
        return AsyncLimitedResponseStreamManager(self, kwargs)


class AsyncEmbeddings(AsyncResource):
    """`embeddings` of a wrapped client: `create` is limited."""

    api = calls.EMBEDDINGS

    async def create(self, **kwargs: Any) -> Any:
        """`embeddings.create`, limited: acquire for the input, call, report the usage."""
        return await self._create("create", kwargs)


class AsyncWrapped(WrappedClient):
    """A wrapped OpenAI client: `chat.completions`, `responses` and `embeddings`
    are limited, the rest passes through (what spends tokens there warns once)."""

    provider = "OpenAI"
    unlimited = calls.UNLIMITED_SPENDERS

    def __init__(
        self,
        client: Any,
        limiter: AsyncClient,
        settings: Any,
        warned: Optional[set] = None,
    ) -> None:
        super().__init__(client, limiter, settings, warned)
        self.gate = AsyncOpenAIGate(limiter, settings)
        completions = AsyncCompletions(self)
        self.chat = WrappedNamespace(
            self, "chat", calls.UNLIMITED_CHAT_PARTS, completions=completions
        )
        self.responses = AsyncResponses(self)
        self.embeddings = AsyncEmbeddings(self)
