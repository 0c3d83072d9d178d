"""What both halves of the Anthropic wrapper share that never waits.

Reading a request's cost and a reply's usage, and adding up a stream's usage
from its events. What a failed call leaves of its lease is the client's rule
(`_core.failed_call`): a 429 keeps what Anthropic counts (the request and its
input; the output, never generated, goes back), a 529 (overloaded) releases;
both are retried (`RETRIED`) with an acquire of their own. The halves
that do wait are written once in `_anthropic_async.py`, and
`_anthropic_sync.py` is generated from it.

Settlement follows what Anthropic counts towards its limits: input tokens per
minute are `input_tokens + cache_creation_input_tokens` — cache reads
(`cache_read_input_tokens`) do not count towards ITPM for current models, so
they are not reported — and output tokens per minute are `output_tokens`.
"""

from __future__ import annotations

import logging
from typing import Any, Optional

from ._openai_calls import Cost

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


def _field(usage: Any, name: str) -> Optional[int]:
    value = usage.get(name) if isinstance(usage, dict) else getattr(usage, name, None)
    return value if isinstance(value, int) else None


def usage_counts(usage: Any) -> Optional[tuple[int, int]]:
    """(input, output) to report for a reply's `usage`: input is `input_tokens +
    cache_creation_input_tokens` (what counts towards ITPM), output `output_tokens`."""
    if usage is None:
        return None
    given = _field(usage, "input_tokens"), _field(usage, "output_tokens")
    if given == (None, None):
        return None
    created = _field(usage, "cache_creation_input_tokens") or 0
    return (given[0] or 0) + created, given[1] or 0


class StreamUsage:
    """A stream's usage, added up from its events: `message_start` carries the
    input, each `message_delta` the output so far (and, lately, the input)."""

    def __init__(self) -> None:
        self.usage: dict = {}
        #: The stream reached `message_stop`: its output count is final.
        self.complete = False

    def add(self, event: Any) -> None:
        kind = getattr(event, "type", None)
        if kind == "message_start":
            usage = getattr(getattr(event, "message", None), "usage", None)
        elif kind == "message_delta":
            usage = getattr(event, "usage", None)
        else:
            self.complete = self.complete or kind == "message_stop"
            return
        for name in ("input_tokens", "cache_creation_input_tokens", "output_tokens"):
            value = _field(usage, name)
            if value is not None:
                self.usage[name] = value

    def counts(self, reserved_output: int) -> Optional[tuple[int, int]]:
        """(input, output) to report; an unfinished stream keeps its reserved output."""
        counts = usage_counts(self.usage)
        if counts is None or self.complete:
            return counts
        return counts[0], max(counts[1], reserved_output)


def snapshot_counts(stream: Any, reserved_output: int) -> Optional[tuple[int, int]]:
    """(input, output) of a `messages.stream()` stream from its message snapshot."""
    try:
        snapshot = stream.current_message_snapshot  # asserts that one exists
    except (AssertionError, AttributeError):
        snapshot = None
    counts = usage_counts(getattr(snapshot, "usage", None))
    if counts is None or getattr(snapshot, "stop_reason", None) is not None:
        return counts
    return counts[0], max(counts[1], reserved_output)
