"""Rate-limit an Anthropic client's messages through the sidecar.

    import anthropic, ratekeeper
    from ratekeeper.anthropic import wrap

    claude = wrap(anthropic.Anthropic(), ratekeeper.Client(), limit="claude")
    reply = claude.messages.create(model="claude-sonnet-4-6", max_tokens=300, messages=[...])
    with claude.messages.stream(model=..., max_tokens=300, messages=[...]) as stream:
        for text in stream.text_stream: ...

Every `messages.create` and `messages.stream` then acquires from the limit —
the daemon counts the request's `system`, messages (text, images by
Anthropic's formula, tool use and results) and `tools`, and reserves
`max_tokens` as output — calls Anthropic, and reports the `usage` it
answered: input `input_tokens + cache_creation_input_tokens`, output
`output_tokens`. Cache reads are not reported: they do not count towards
Anthropic's input-tokens-per-minute limit for current models. Streams report
when they are left (`messages.stream`) or end (`create(stream=True)`).

A 429 (rate limited) keeps the request and its input spent and gives the
reserved output back (`Lease.settle_as_rejected`); a 529 (overloaded: the
API short of capacity for everyone, not a rate-limit decision) releases the
lease. Either is forwarded to the sidecar (a 429 pauses the limit for every
worker until its `retry-after`), waited out, and tried again with an acquire
of its own, up to `max_retries` times; the wrapped client's own retries are
turned off for these calls. The
`anthropic-ratelimit-*` headers of a sample of successful answers are
forwarded too (every `feedback_interval` seconds). `ratekeeper.RateLimited`
from the sidecar itself reaches the caller.

The same calls are limited wherever the SDK offers them: `messages.parse`;
`messages.with_raw_response.create` (the SDK's raw answer, settled from its
parsed usage, its headers always forwarded; a stream's `parse()` gives
events that settle at their end); `messages.with_streaming_response.create`
(settled when its `with` block is left, from what was read through
`parse()`, `json()`, `read()` or `text()`, else as reserved); and
`beta.messages` (`create`, `parse`, `stream`, and the same views).

Works with `anthropic.Anthropic` (with `ratekeeper.Client`) and
`anthropic.AsyncAnthropic` (with `ratekeeper.AsyncClient`), and with their
`with_options()` / `copy()` copies; `wrap` returns the client's own type to
type checkers. Everything else passes through to the wrapped client, and
the parts that spend tokens unlimited — `messages.batches` and
`beta.messages.batches`, `beta.messages.tool_runner` and `thread`,
`beta.sessions`, `beta.deployments` and `beta.dreams`, the client-wide and
`beta`-wide `with_raw_response` / `with_streaming_response` (and legacy
`completions` where the SDK has it) — warn once, with the OpenAI wrapper's
`RuntimeWarning`. `messages.count_tokens` spends nothing and does not warn.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, TypeVar, Union, cast

from ._async.anthropic import AsyncWrapped
from ._async.client import AsyncClient
from ._core.calls import CallOptions, is_async_sdk
from ._sync.anthropic import Wrapped
from ._sync.client import Client

__all__ = ["LimitOptions", "wrap"]

#: The wrapped client's type, kept for type checkers.
AnthropicClient = TypeVar("AnthropicClient")


@dataclass(frozen=True)
class LimitOptions(CallOptions):
    """How a wrapped client acquires (`limit`, `tenant`, `priority`, `max_wait`:
    every wrapper's `CallOptions`), and how it retries provider 429s and 529s."""

    #: Provider 429s and 529s retried per call before the error is raised.
    max_retries: int = 3
    #: Longest single wait for a 429 or 529, whatever the headers say.
    max_retry_wait: float = 60.0
    #: Seconds between forwarding the rate-limit headers of successful answers
    #: to the sidecar (0: every answer; None: forward nothing, not even 429s).
    feedback_interval: Optional[float] = 0.25


def wrap(
    client: AnthropicClient,
    limiter: Union[Client, AsyncClient],
    limit: str,
    **options: Any,
) -> AnthropicClient:
    """An Anthropic client whose messages are limited by `limiter` on `limit`.

    `options` are the fields of `LimitOptions`: `tenant`, `priority`,
    `max_wait`, `max_retries`, `max_retry_wait`, `feedback_interval`.
    Token-spending parts the wrapper does not limit (`messages.batches`,
    `beta.sessions`, ...) pass through with a `RuntimeWarning` the first time
    each is reached.
    """
    settings = LimitOptions(limit=limit, **options)
    create = client.messages.create  # type: ignore[attr-defined]
    async_limiter = isinstance(limiter, AsyncClient)
    is_async = is_async_sdk(
        create, async_limiter, "anthropic.AsyncAnthropic", "anthropic.Anthropic"
    )
    wrapped = (AsyncWrapped if is_async else Wrapped)(client, limiter, settings)
    return cast(AnthropicClient, wrapped)
