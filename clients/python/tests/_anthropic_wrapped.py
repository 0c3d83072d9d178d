"""What the Anthropic wrapper's tests share: the request they send, what the
fake provider answers to it, and how they read the buckets it drew from."""

from __future__ import annotations

from collections.abc import Iterator

from ratekeeper import Client

from _fake_anthropic import FakeAnthropic

MODEL = "claude-sonnet-4-6"
MESSAGES = [{"role": "user", "content": "Summarise the plot of Hamlet in one sentence."}]
#: What the fake answers: 100 input tokens, 50 written to the cache, 5000 read
#: from it, 20 output tokens. ITPM counts 150 of the input; OTPM 20.
USAGE = {"input_tokens": 100, "cache_creation_input_tokens": 50, "cache_read_input_tokens": 5000}
INPUT_CHARGED = 150
OUTPUT = 20


def fake_provider() -> Iterator[FakeAnthropic]:
    """The fake answering `USAGE` and `OUTPUT`, closed when the test ends (a fixture's body)."""
    fake = FakeAnthropic(output_tokens=OUTPUT, **USAGE)
    yield fake
    fake.close()


def levels(limiter: Client, limit: str = "claude") -> tuple[int, int]:
    """The input and output token buckets' levels of `limit`."""
    status = limiter.status(limit).limit(limit)
    return status.bucket("input_tokens").level, status.bucket("output_tokens").level
