"""The Anthropic wrapper, with the real `anthropic` SDK, the real daemon and a fake provider."""

from __future__ import annotations

import asyncio
import time

import anthropic
import pytest

from ratekeeper import AsyncClient, Client, CostExceedsCapacity, RateLimited
from ratekeeper.anthropic import wrap

from _anthropic_wrapped import (
    INPUT_CHARGED,
    MESSAGES,
    MODEL,
    OUTPUT,
    fake_provider,
    levels,
)
from _fake_anthropic import FakeAnthropic

CONFIG = """
[[limits]]
name = "claude"
provider = "anthropic"
input_tokens_per_minute = 1
output_tokens_per_minute = 1
burst_input_tokens = 1000000
burst_output_tokens = 1000000

[[limits]]
name = "fleet"
provider = "anthropic"
input_tokens_per_minute = 120000
output_tokens_per_minute = 120000
burst_input_tokens = 30000
burst_output_tokens = 30000
requests_per_minute = 1200
burst_requests = 30

# Requests counted exactly too (one a minute refills nothing within a test).
[[limits]]
name = "counted"
provider = "anthropic"
input_tokens_per_minute = 1
output_tokens_per_minute = 1
burst_input_tokens = 1000000
burst_output_tokens = 1000000
requests_per_minute = 1
burst_requests = 1000
burst_headroom_ms = 0

[[limits]]
name = "tiny"
provider = "anthropic"
input_tokens_per_minute = 60
output_tokens_per_minute = 60
burst_input_tokens = 1000
burst_output_tokens = 1000
"""
CAPACITY = 1_000_000
SYSTEM = "You are terse."


@pytest.fixture
def provider():
    yield from fake_provider()


@pytest.fixture
def daemon(make_daemon):
    return make_daemon(CONFIG)


def counted_input(limiter: Client, limit: str = "claude") -> int:
    """The input the wrapper reserves for MESSAGES (the daemon's count)."""
    return limiter.estimate(limit, messages=MESSAGES, max_tokens=1, api="anthropic").input_tokens


def sync_anthropic(provider: FakeAnthropic) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=provider.base_url, api_key="test-key", max_retries=2)


def test_create_reports_input_with_cache_writes_and_output_separately(make_daemon, store, provider):
    daemon = make_daemon(CONFIG, store=store)
    with Client(daemon.socket) as limiter:
        claude = wrap(sync_anthropic(provider), limiter, limit="claude")
        reply = claude.messages.create(
            model=MODEL, max_tokens=300, system=SYSTEM, messages=MESSAGES
        )
        assert isinstance(reply, anthropic.types.Message)
        assert reply.content[0].text == "fake reply"
        # Reserved: the counted prompt and 300 output tokens; settled to what
        # counts towards Anthropic's limits (cache reads do not).
        assert levels(limiter) == (CAPACITY - INPUT_CHARGED, CAPACITY - OUTPUT)
        (body,) = provider.bodies
        assert (body["system"], body["messages"], body["max_tokens"]) == (SYSTEM, MESSAGES, 300)
        assert claude.base_url == sync_anthropic(provider).base_url  # the rest passes through


def test_stream_settles_when_it_is_left(daemon, provider):
    with Client(daemon.socket) as limiter:
        claude = wrap(sync_anthropic(provider), limiter, limit="claude")
        with claude.messages.stream(model=MODEL, max_tokens=300, messages=MESSAGES) as stream:
            assert "".join(stream.text_stream) == "fake reply"
            assert levels(limiter)[1] == CAPACITY - 300  # held while it streams
        assert stream.get_final_message().usage.output_tokens == OUTPUT
        assert levels(limiter) == (CAPACITY - INPUT_CHARGED, CAPACITY - OUTPUT)


def test_create_with_stream_settles_at_its_end(daemon, provider):
    with Client(daemon.socket) as limiter:
        claude = wrap(sync_anthropic(provider), limiter, limit="claude")
        events = claude.messages.create(model=MODEL, max_tokens=300, messages=MESSAGES, stream=True)
        kinds = [event.type for event in events]
        assert (kinds[0], kinds[-1]) == ("message_start", "message_stop")
        assert levels(limiter) == (CAPACITY - INPUT_CHARGED, CAPACITY - OUTPUT)


def test_async_create_and_streams(daemon, provider):
    async def main() -> None:
        async with AsyncClient(daemon.socket) as limiter:
            raw = anthropic.AsyncAnthropic(base_url=provider.base_url, api_key="test-key")
            claude = wrap(raw, limiter, limit="claude")
            reply = await claude.messages.create(
                model=MODEL, max_tokens=300, system=SYSTEM, messages=MESSAGES
            )
            assert reply.usage.output_tokens == OUTPUT
            async with claude.messages.stream(
                model=MODEL, max_tokens=300, messages=MESSAGES
            ) as stream:
                assert [text async for text in stream.text_stream] == ["fake reply"]
            events = await claude.messages.create(
                model=MODEL, max_tokens=300, messages=MESSAGES, stream=True
            )
            assert [event.type async for event in events][-1] == "message_stop"
            status = (await limiter.status("claude")).limit("claude")
            assert status.bucket("input_tokens").level == CAPACITY - 3 * INPUT_CHARGED
            assert status.bucket("output_tokens").level == CAPACITY - 3 * OUTPUT

    asyncio.run(main())


def test_a_429_is_forwarded_pausing_every_worker_then_retried(daemon, provider):
    provider.force(429, count=2, retry_after="1")
    with Client(daemon.socket) as limiter, Client(daemon.socket) as other:
        once = wrap(sync_anthropic(provider), limiter, limit="fleet", max_retries=0)
        with pytest.raises(anthropic.RateLimitError):
            once.messages.create(model=MODEL, max_tokens=10, messages=MESSAGES)
        # Forwarded: every worker's acquire waits out the provider's retry-after,
        # plus the refill of its own token (0.5 ms, in whole ms) when it asks
        # within a millisecond of the pause.
        with pytest.raises(RateLimited) as denied:
            other.acquire("fleet", 1, max_tokens=1, max_wait=0)
        assert 0.5 < denied.value.retry_after <= 1.001

        claude = wrap(sync_anthropic(provider), limiter, limit="fleet")
        started = time.monotonic()
        reply = claude.messages.create(model=MODEL, max_tokens=10, messages=MESSAGES)
        # The retry was held back in the sidecar until the new pause ended.
        assert time.monotonic() - started >= 0.95
        assert provider.answered == [429, 429, 200]
        assert reply.usage.output_tokens == OUTPUT


def test_a_429_keeps_the_request_and_its_input_and_the_retry_acquires_again(daemon, provider):
    provider.force(429, retry_after="0")
    with Client(daemon.socket) as limiter:
        claude = wrap(sync_anthropic(provider), limiter, limit="counted", feedback_interval=None)
        claude.messages.create(model=MODEL, max_tokens=300, messages=MESSAGES)
        assert provider.answered == [429, 200]
        status = limiter.status("counted").limit("counted")
        # Two requests reached Anthropic; both count, one acquire each.
        assert status.bucket("requests").level == 1000 - 2
        # The refused one keeps its input; its output, never generated, went back.
        refused = counted_input(limiter, "counted")
        assert status.bucket("input_tokens").level == CAPACITY - INPUT_CHARGED - refused
        assert status.bucket("output_tokens").level == CAPACITY - OUTPUT


def test_async_a_429_keeps_its_input(daemon, provider):
    async def main() -> tuple[int, int]:
        async with AsyncClient(daemon.socket) as limiter:
            raw = anthropic.AsyncAnthropic(base_url=provider.base_url, api_key="test-key")
            claude = wrap(raw, limiter, limit="claude", feedback_interval=None)
            provider.force(429, retry_after="0")
            async with claude.messages.stream(
                model=MODEL, max_tokens=300, messages=MESSAGES
            ) as stream:
                assert [text async for text in stream.text_stream] == ["fake reply"]
            await raw.close()
            status = (await limiter.status("claude")).limit("claude")
            return status.bucket("input_tokens").level, status.bucket("output_tokens").level

    got = asyncio.run(asyncio.wait_for(main(), 30))
    assert provider.answered == [429, 200]
    with Client(daemon.socket) as limiter:
        refused = counted_input(limiter)
    assert got == (CAPACITY - INPUT_CHARGED - refused, CAPACITY - OUTPUT)


def test_a_529_is_released_and_retried(daemon, provider):
    provider.force(529, retry_after="0")
    with Client(daemon.socket) as limiter:
        claude = wrap(sync_anthropic(provider), limiter, limit="claude", feedback_interval=None)
        claude.messages.create(model=MODEL, max_tokens=300, messages=MESSAGES)
        assert provider.answered == [529, 200]
        # Overloaded is Anthropic refusing everyone, not its rate limiter
        # counting this request: the attempt gave its reservation back.
        assert levels(limiter) == (CAPACITY - INPUT_CHARGED, CAPACITY - OUTPUT)


def test_persistent_overload_gives_up_after_max_retries(daemon, provider):
    provider.force(529, count=10, retry_after="0")
    with Client(daemon.socket) as limiter:
        claude = wrap(
            sync_anthropic(provider), limiter, limit="claude", max_retries=2, feedback_interval=None
        )
        with pytest.raises(anthropic.APIStatusError) as failed:
            claude.messages.create(model=MODEL, max_tokens=300, messages=MESSAGES)
        assert failed.value.status_code == 529
        assert provider.answered == [529] * 3  # the wrapped client's own retries are off
        assert levels(limiter) == (CAPACITY, CAPACITY)


def test_a_refused_request_is_released(daemon, provider):
    provider.force(400)
    with Client(daemon.socket) as limiter:
        claude = wrap(sync_anthropic(provider), limiter, limit="claude")
        with pytest.raises(anthropic.BadRequestError):
            claude.messages.create(model=MODEL, max_tokens=300, messages=MESSAGES)
        assert levels(limiter) == (CAPACITY, CAPACITY)


def test_the_providers_remaining_counts_lower_the_shared_buckets(daemon):
    # Anthropic allows less than the sidecar's "fleet" (30000-token burst).
    provider = FakeAnthropic(remaining_tokens=5000)
    try:
        with Client(daemon.socket) as limiter:
            claude = wrap(sync_anthropic(provider), limiter, limit="fleet", feedback_interval=0)
            started = time.monotonic()
            claude.messages.create(model=MODEL, max_tokens=10, messages=MESSAGES)
            level = levels(limiter, "fleet")[0]
            # Lowered to the provider's 5000 (read as 5500: Anthropic rounds a
            # token count to the nearest thousand), give or take what refilled
            # since (2000 a second), from the 30000 it held.
            assert level <= 5500 + 2000 * (time.monotonic() - started)
    finally:
        provider.close()


def test_the_system_prompt_is_counted_before_the_provider_is_called(daemon, provider):
    """An 11 KB system prompt is far more than the 1000-token burst of "tiny"."""
    with Client(daemon.socket) as limiter:
        claude = wrap(sync_anthropic(provider), limiter, limit="tiny")
        with pytest.raises(CostExceedsCapacity):
            claude.messages.create(
                model=MODEL, max_tokens=10, system="x " * 5500, messages=MESSAGES
            )
        assert provider.bodies == []
        claude.messages.create(model=MODEL, max_tokens=10, system=SYSTEM, messages=MESSAGES)
        # The SDK's markers for "not given" are not a system prompt or tools.
        claude.messages.create(
            model=MODEL,
            max_tokens=10,
            system=anthropic.NOT_GIVEN,
            tools=anthropic.omit,
            messages=MESSAGES,
        )
        assert len(provider.bodies) == 2


def test_an_unknown_block_is_refused_before_the_call(daemon, provider):
    with Client(daemon.socket) as limiter:
        claude = wrap(sync_anthropic(provider), limiter, limit="claude")
        messages = [{"role": "user", "content": [{"type": "hologram", "data": "..."}]}]
        with pytest.raises(ValueError, match="'hologram' is not known"):
            claude.messages.create(model=MODEL, max_tokens=10, messages=messages)
        assert provider.bodies == []
        assert levels(limiter) == (CAPACITY, CAPACITY)


def test_the_wrapper_needs_a_matching_limiter(daemon, provider):
    raw = anthropic.AsyncAnthropic(base_url=provider.base_url, api_key="test-key")
    with Client(daemon.socket) as limiter, pytest.raises(TypeError, match="AsyncAnthropic"):
        wrap(raw, limiter, limit="claude")
