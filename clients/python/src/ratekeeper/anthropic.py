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

Works with `anthropic.Anthropic` (with `ratekeeper.Client`) and
`anthropic.AsyncAnthropic` (with `ratekeeper.AsyncClient`); `wrap` returns the
client's own type to type checkers, and everything other than the two calls
passes through to the wrapped client.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, TypeVar, Union, cast

from ._anthropic_async import AsyncMessages
from ._anthropic_sync import Messages
from ._async import AsyncClient
from ._openai_core import CallOptions, is_async_sdk, without_retries
from ._sync import Client

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
    """
    settings = LimitOptions(limit=limit, **options)
    create = client.messages.create  # type: ignore[attr-defined]
    is_async = is_async_sdk(create, limiter, "anthropic.AsyncAnthropic", "anthropic.Anthropic")
    return cast(AnthropicClient, _Wrapped(client, limiter, settings, is_async))


class _Wrapped:
    """The wrapped client: `messages.create` and `messages.stream` are limited."""

    def __init__(self, client: Any, limiter: Any, settings: LimitOptions, is_async: bool) -> None:
        self._client = client
        self._raw = without_retries(client)
        self.limiter = limiter
        self.settings = settings
        self.messages = (AsyncMessages if is_async else Messages)(self)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)
