"""Rate-limit an OpenAI client's token-spending calls through the sidecar.

    import openai, ratekeeper
    from ratekeeper.openai import wrap

    llm = wrap(openai.OpenAI(), ratekeeper.Client(), limit="gpt-4o-mini")
    reply = llm.chat.completions.create(model="gpt-4o-mini", messages=[...], max_tokens=300)
    answer = llm.responses.create(model="gpt-4o-mini", input="...", max_output_tokens=300)
    vectors = llm.embeddings.create(model="text-embedding-3-small", input=["...", "..."])

Each limited call acquires from the limit, calls the provider, and reports
the `usage` it answered, so the unused part of the reservation goes back:

- `chat.completions.create` and `parse`: the messages and `tools` (counted
  by the daemon) and `max_completion_tokens` / `max_tokens`; usage
  `prompt_tokens` / `completion_tokens`. Streams report when they end (the
  wrapper asks for `stream_options={"include_usage": True}` and hides the
  extra usage chunk from callers who did not ask for it).
- `responses.create` and `parse`: `instructions`, `input` and `tools` become
  chat messages the way the daemon's `ratekeeper count-tokens` reads a
  Responses request (a system message, then one message per input item:
  messages of `input_text` / `output_text` / `refusal` / `input_image` parts,
  `function_call`, `function_call_output`); `max_output_tokens` is the output.
  Other item and part types (reasoning, item references, files, built-in tool
  calls) raise `ValueError` before anything is acquired rather than being
  counted as nothing. Usage `input_tokens` / `output_tokens`; a stream
  reports from its final event (`response.completed`). Context the request
  does not carry (`previous_response_id`, `conversation`, stored prompts) is
  not reserved, only reported; a `background=True` response keeps its
  reservation (its usage is not in the answer).
- `embeddings.create`: the texts, counted by the daemon as the parts of one
  message (their sum plus one message's framing), or token ids counted
  exactly; no output; usage `prompt_tokens`.
- `chat.completions.stream(...)` and `responses.stream(...)` acquire when
  their `with` block is entered and settle when it is left; a stream left
  before its end keeps its whole reservation.
- `with_raw_response.<call>` of the three: the SDK's raw answer, settled from
  its parsed usage, its headers always forwarded (a stream's `parse()`
  settles at its end); `with_streaming_response.<call>`: settled when its
  `with` block is left, from what was read through `parse()`, `json()`,
  `read()` or `text()`, else as reserved (a chat stream's raw lines carry
  the usage chunk the wrapper asks for).

A 429 from the provider (other applications on the same key) keeps the
request and its input spent (OpenAI counts unsuccessful requests towards its
per-minute limits: `Lease.settle_as_rejected`), forwards the answer's headers
to the sidecar (which pauses the limit for every worker until the
`retry-after`), waits that long, and tries again with an acquire of its own,
up to `max_retries` times; other 4xx release the lease, 5xx and timeouts
keep it. The rate-limit headers of successful answers are forwarded too, at most
every `feedback_interval` seconds, so the shared buckets follow the provider's
`remaining` counts when other traffic uses the same key.
`ratekeeper.RateLimited` from the sidecar itself is not retried: it reaches
the caller, who can answer 503 with its `retry_after`.

Works with `openai.OpenAI` and `openai.AsyncOpenAI` (with `ratekeeper.Client`
and `ratekeeper.AsyncClient` respectively), and with their `with_options()`
copies; everything else passes through to the wrapped client, and the parts
that spend tokens unlimited (legacy `completions`, `images`, `audio`,
`beta`, `batches`, `realtime`, `responses.compact` and `connect`, the
client-wide `with_raw_response` / `with_streaming_response`) warn once. The
wrapped client's own retries are turned off (`max_retries=0`) for the limited
calls, so that 429s are not retried behind the limiter's back.

The daemon counts the messages with the limit's tokenizer. A daemon from
before token counting answers `Unsupported` to a messages cost; the wrapper
then falls back to a rough client-side estimate
(`ratekeeper.estimate_prompt_tokens`, about four characters a token) plus
the output. The fallback is transitional and goes once such daemons are gone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional, TypeVar, Union, cast

from ._async.client import AsyncClient
from ._async.openai import AsyncWrapped
from ._core.calls import CallOptions, is_async_sdk, retry_delay
from ._core.estimate import FALLBACK_MAX_TOKENS as FALLBACK_MAX_TOKENS
from ._core.estimate import estimate_prompt_tokens
from ._sync.client import Client
from ._sync.openai import Wrapped

__all__ = ["LimitOptions", "retry_delay", "wrap"]


@dataclass(frozen=True)
class LimitOptions(CallOptions):
    """How a wrapped client acquires (`limit`, `tenant`, `priority`, `max_wait`:
    every wrapper's `CallOptions`), and how it retries provider 429s."""

    #: Output tokens reserved when a request names no `max_tokens` (Responses:
    #: `max_output_tokens`). None: the daemon's default for the limit, or
    #: `FALLBACK_MAX_TOKENS` when the client has to estimate.
    default_max_tokens: Optional[int] = None
    #: Provider 429s retried per call before the error is raised.
    max_retries: int = 3
    #: Longest single wait for a 429, whatever the headers say.
    max_retry_wait: float = 60.0
    #: Seconds between forwarding the rate-limit headers of successful answers
    #: to the sidecar (0: every answer; None: forward nothing, not even 429s).
    feedback_interval: Optional[float] = 0.25
    #: Client-side prompt estimate used while the daemon cannot count messages.
    estimate: Callable[..., int] = estimate_prompt_tokens


OpenAIClient = TypeVar("OpenAIClient")


def wrap(
    client: OpenAIClient,
    limiter: Union[Client, AsyncClient],
    limit: str,
    **options: Any,
) -> OpenAIClient:
    """An OpenAI client whose chat completions, responses and embeddings are
    limited by `limiter` on `limit` (see the module's documentation).

    `options` are the fields of `LimitOptions`: `tenant`, `priority`,
    `max_wait`, `default_max_tokens`, `max_retries`, `max_retry_wait`,
    `feedback_interval`. The result keeps the client's type for editors and
    type checkers. Token-spending parts the wrapper does not limit (legacy
    `completions`, `images`, `audio`, ...) pass through with a
    `RuntimeWarning` the first time each is reached.
    """
    settings = LimitOptions(limit=limit, **options)
    create = client.chat.completions.create  # type: ignore[attr-defined]
    async_limiter = isinstance(limiter, AsyncClient)
    is_async = is_async_sdk(create, async_limiter, "openai.AsyncOpenAI", "openai.OpenAI")
    wrapped = (AsyncWrapped if is_async else Wrapped)(client, limiter, settings)
    return cast(OpenAIClient, wrapped)
