"""What both halves of the Anthropic wrapper share that never waits.

Reading a request's cost and a reply's usage, and adding up a stream's usage
from its events. What a failed call leaves of its lease is the client's rule
(`failed_call`): a 429 keeps what Anthropic counts (the request and its
input; the output, never generated, goes back), a 529 (overloaded) releases;
both are retried (`RETRIED`) with an acquire of their own. The halves
that do wait are written once in `_async/anthropic.py`, and
`_sync/anthropic.py` is generated from it.

Usage is reported as Anthropic bills it (`Counts`): `input_tokens` at the
full price, `cache_read_input_tokens` as cache reads and
`cache_creation_input_tokens` as cache writes (three disjoint figures), and
`output_tokens`. The daemon settles the rate limit by what Anthropic counts
towards it: input tokens per minute are `input_tokens +
cache_creation_input_tokens` (cache reads do not count towards ITPM for
current models), output tokens per minute `output_tokens`.

Which parts of the client are limited (`MESSAGES`, `BETA_MESSAGES`: `create`
and `parse`, also under `with_raw_response` and `with_streaming_response`,
and `stream`) and which spend tokens unlimited and warn once
(`wrapping.warn_unlimited`, the OpenAI wrapper's `RuntimeWarning`) are here too.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Optional

from .calls import Cost, Counts

log = logging.getLogger("ratekeeper.anthropic")

#: Provider statuses retried after `retry-after`: rate limited (its lease
#: settled as rejected), and overloaded (released: not a rate-limit decision).
RETRIED = (429, 529)


def cost(kwargs: dict) -> Cost:
    """The messages, system, tools and max_tokens of a `messages.create` call; the
    SDK's `NOT_GIVEN` and `omit` (both false) and an empty system are as if not given."""
    return Cost(
        list(kwargs.get("messages") or []),
        tools=kwargs.get("tools") or None,
        max_tokens=kwargs.get("max_tokens") or None,
        system=kwargs.get("system") or None,
    )


def _get(value: Any, name: str) -> Any:
    """`value[name]` of a dict (a JSON body), `value.name` of an SDK object; None if absent."""
    return value.get(name) if isinstance(value, Mapping) else getattr(value, name, None)


def _field(usage: Any, name: str) -> Optional[int]:
    value = _get(usage, name)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


#: The fields of Anthropic's `usage` that the wrapper reports.
USAGE_FIELDS = (
    "input_tokens",
    "cache_read_input_tokens",
    "cache_creation_input_tokens",
    "output_tokens",
)


def usage_counts(usage: Any) -> Optional[Counts]:
    """What to report for a reply's `usage`: `input_tokens`, `output_tokens`,
    and the cache reads and writes (`cache_read_input_tokens`,
    `cache_creation_input_tokens`; 0 when absent)."""
    if usage is None:
        return None
    given = _field(usage, "input_tokens"), _field(usage, "output_tokens")
    if given == (None, None):
        return None
    return Counts(
        given[0] or 0,
        given[1] or 0,
        cached_input_tokens=_field(usage, "cache_read_input_tokens") or 0,
        cache_write_tokens=_field(usage, "cache_creation_input_tokens") or 0,
    )


class StreamUsage:
    """A stream's usage, added up from its events: `message_start` carries the
    input, each `message_delta` the output so far (and, lately, the input)."""

    def __init__(self) -> None:
        self.usage: dict = {}
        #: The stream reached `message_stop`: its output count is final.
        self.complete = False

    def add(self, event: Any) -> None:
        """Notes an event's usage: the SDK's event object, or its JSON (a dict)."""
        kind = _get(event, "type")
        if kind == "message_start":
            usage = _get(_get(event, "message"), "usage")
        elif kind == "message_delta":
            usage = _get(event, "usage")
        else:
            self.complete = self.complete or kind == "message_stop"
            return
        for name in USAGE_FIELDS:
            value = _field(usage, name)
            if value is not None:
                self.usage[name] = value

    def counts(self, reserved_output: int) -> Optional[Counts]:
        """What to report; an unfinished stream keeps its reserved output."""
        counts = usage_counts(self.usage)
        if counts is None or self.complete:
            return counts
        return counts._replace(output_tokens=max(counts.output_tokens, reserved_output))


def snapshot_counts(stream: Any, reserved_output: int) -> Optional[Counts]:
    """What a `messages.stream()` stream used, from its message snapshot."""
    try:
        snapshot = stream.current_message_snapshot  # asserts that one exists
    except (AssertionError, AttributeError):
        snapshot = None
    counts = usage_counts(getattr(snapshot, "usage", None))
    if counts is None or getattr(snapshot, "stop_reason", None) is not None:
        return counts
    return counts._replace(output_tokens=max(counts.output_tokens, reserved_output))


def reply_counts(reply: Any) -> Optional[Counts]:
    """What a whole answer used: the SDK's message, or its JSON body (a dict)."""
    return usage_counts(_get(reply, "usage"))


def body_counts(body: Any, reserved_output: int) -> Optional[Counts]:
    """What an answer's body used as the caller read it
    (`with_streaming_response`): a message's JSON, or a stream's server-sent
    events, whose usage is added up as `StreamUsage` does (an unfinished
    stream keeps its reserved output). None: no usage in it."""
    if isinstance(body, bytes):
        body = body.decode("utf-8", "replace")
    if not isinstance(body, str):
        return reply_counts(body)
    try:
        return reply_counts(json.loads(body))
    except ValueError:
        pass
    usage = StreamUsage()
    for line in body.splitlines():
        if not line.startswith("data:"):
            continue
        try:
            usage.add(json.loads(line[5:]))
        except ValueError:
            continue  # a line cut short
    return usage.counts(reserved_output)


@dataclass(frozen=True)
class Endpoint:
    """A `messages` resource the wrapper limits: where it is in the SDK client,
    its methods that are limited like `create` (also under `with_raw_response`
    and `with_streaming_response`; `stream` is limited besides), and its
    other methods that spend tokens unlimited (they warn)."""

    path: str
    methods: frozenset = frozenset({"create", "parse"})
    unlimited: frozenset = frozenset({"batches"})


#: `messages`: `batches` (half-price, asynchronous, under limits of their own) is not limited.
MESSAGES = Endpoint("messages")
#: `beta.messages`: neither are `batches`, nor `tool_runner` and `thread`,
#: which make their calls themselves, through the SDK client.
BETA_MESSAGES = Endpoint("beta.messages", unlimited=frozenset({"batches", "tool_runner", "thread"}))

#: Parts of the Anthropic client that spend tokens but pass through the
#: wrapper unlimited: reaching one warns (once per wrapped client and name).
#: The client-wide `with_raw_response` / `with_streaming_response` reach
#: `messages` unlimited (the wrapped `messages` have their own); legacy
#: `completions` is in SDKs that still have it.
UNLIMITED_SPENDERS = frozenset({"completions", "with_raw_response", "with_streaming_response"})
#: The same for `beta` (its `messages` are limited): the managed agents'
#: `sessions`, `deployments` and `dreams` run models, and its own raw and
#: streaming views reach `beta.messages` unlimited.
UNLIMITED_BETA_PARTS = frozenset(
    {"sessions", "deployments", "dreams", "with_raw_response", "with_streaming_response"}
)
