"""The Anthropic wrapper's other ways into the limited calls, with the real
`anthropic` SDK, the real daemon and the fake provider: `with_raw_response`,
`with_streaming_response`, `messages.parse`, `beta.messages` and
`with_options`; and the one-time warning for what stays unlimited."""

from __future__ import annotations

import asyncio
import warnings

import anthropic
import pytest

from ratekeeper import AsyncClient, Client
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

#: "claude" barely refills, so levels can be asserted exactly; "fleet" has
#: room to show a forwarded `remaining` count lowering it.
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
input_tokens_per_minute = 60000
output_tokens_per_minute = 60000
burst_input_tokens = 100000
burst_output_tokens = 100000
"""
CAPACITY = 1_000_000
REQUEST = {"model": MODEL, "max_tokens": 300, "messages": MESSAGES}
#: Every `async` test's bound.
TIMEOUT = 30


@pytest.fixture
def provider():
    yield from fake_provider()


@pytest.fixture
def daemon(make_daemon):
    return make_daemon(CONFIG)


def spent(calls: int) -> tuple[int, int]:
    """The levels after `calls` calls settled from the fake's usage."""
    return CAPACITY - calls * INPUT_CHARGED, CAPACITY - calls * OUTPUT


def reserved(limiter: Client) -> tuple[int, int]:
    """What one call of REQUEST holds until it settles: the counted input and `max_tokens`."""
    estimate = limiter.estimate("claude", messages=MESSAGES, max_tokens=1, api="anthropic")
    return estimate.input_tokens, REQUEST["max_tokens"]


def claude_for(provider: FakeAnthropic, limiter: Client, **options) -> anthropic.Anthropic:
    raw = anthropic.Anthropic(base_url=provider.base_url, api_key="test-key", max_retries=2)
    return wrap(raw, limiter, limit=options.pop("limit", "claude"), **options)


def test_a_raw_create_is_limited_and_always_forwards_its_headers(daemon, provider):
    with Client(daemon.socket) as limiter:
        # A sample per hour: only the first plain answer's headers go out.
        claude = claude_for(provider, limiter, limit="fleet", feedback_interval=3600)
        claude.messages.create(**REQUEST)
        provider.remaining_tokens = 1000
        claude.messages.create(**REQUEST)
        assert levels(limiter, "fleet")[0] > 90000  # not sampled: not forwarded
        answer = claude.messages.with_raw_response.create(**REQUEST)
        assert answer.headers["anthropic-ratelimit-input-tokens-remaining"] == "1000"
        assert answer.parse().content[0].text == "fake reply"
        # Forwarded although no sample was due: the bucket follows the provider's count.
        assert levels(limiter, "fleet")[0] < 50000


def test_a_raw_create_settles_from_its_usage(daemon, provider):
    with Client(daemon.socket) as limiter:
        claude = claude_for(provider, limiter)
        reply = claude.messages.with_raw_response.create(**REQUEST).parse()
        assert reply.usage.output_tokens == OUTPUT
        assert levels(limiter) == spent(1)
        assert len(provider.bodies) == 1


def test_a_raw_stream_settles_at_its_end(daemon, provider):
    with Client(daemon.socket) as limiter:
        claude = claude_for(provider, limiter)
        answer = claude.messages.with_raw_response.create(**REQUEST, stream=True)
        assert answer.headers["content-type"] == "text/event-stream"
        events = answer.parse()
        assert levels(limiter) == tuple(CAPACITY - n for n in reserved(limiter))
        kinds = [event.type for event in events]
        assert (kinds[0], kinds[-1]) == ("message_start", "message_stop")
        assert levels(limiter) == spent(1)


def test_a_streaming_response_settles_from_what_was_parsed_when_it_is_left(daemon, provider):
    with Client(daemon.socket) as limiter:
        claude = claude_for(provider, limiter)
        with claude.messages.with_streaming_response.create(**REQUEST) as response:
            # Held from entering: the request is made, its answer not yet read.
            assert levels(limiter) == tuple(CAPACITY - n for n in reserved(limiter))
            assert response.headers["request-id"] == "req_fake"
            message = response.parse()
        assert message.usage.output_tokens == OUTPUT
        assert levels(limiter) == spent(1)


def test_a_streaming_response_settles_from_a_body_read_as_json_or_text(daemon, provider):
    with Client(daemon.socket) as limiter:
        claude = claude_for(provider, limiter)
        with claude.messages.with_streaming_response.create(**REQUEST) as response:
            assert response.json()["usage"]["output_tokens"] == OUTPUT
        assert levels(limiter) == spent(1)
        # A stream's events read as text: their usage is added up.
        with claude.messages.with_streaming_response.create(**REQUEST, stream=True) as response:
            assert "message_stop" in response.text()
        assert levels(limiter) == spent(2)


def test_a_streaming_response_stream_parsed_settles_from_its_events(daemon, provider):
    with Client(daemon.socket) as limiter:
        claude = claude_for(provider, limiter)
        with claude.messages.with_streaming_response.create(**REQUEST, stream=True) as response:
            kinds = [event.type for event in response.parse()]
        assert kinds[-1] == "message_stop"
        assert levels(limiter) == spent(1)


def test_a_streaming_response_read_line_by_line_keeps_its_reservation(daemon, provider):
    with Client(daemon.socket) as limiter:
        claude = claude_for(provider, limiter)
        with claude.messages.with_streaming_response.create(**REQUEST, stream=True) as response:
            lines = list(response.iter_lines())
        assert any("message_stop" in line for line in lines)
        # The usage went by unseen: the reservation counts as spent.
        assert levels(limiter) == tuple(CAPACITY - n for n in reserved(limiter))


def test_a_streaming_response_429_is_retried(daemon, provider):
    provider.force(429, count=2, retry_after="0")
    with Client(daemon.socket) as limiter:
        claude = claude_for(provider, limiter, feedback_interval=None)
        with claude.messages.with_streaming_response.create(**REQUEST) as response:
            response.parse()
        assert provider.answered == [429, 429, 200]
        # The two refused attempts keep their input: the provider counts them.
        refused = 2 * reserved(limiter)[0]
        assert levels(limiter) == (CAPACITY - INPUT_CHARGED - refused, CAPACITY - OUTPUT)


def test_parse_is_limited(daemon, provider):
    with Client(daemon.socket) as limiter:
        claude = claude_for(provider, limiter)
        reply = claude.messages.parse(**REQUEST)
        assert reply.usage.output_tokens == OUTPUT
        assert levels(limiter) == spent(1)


def test_beta_messages_create_and_stream_are_limited(daemon, provider):
    with Client(daemon.socket) as limiter:
        claude = claude_for(provider, limiter)
        reply = claude.beta.messages.create(**REQUEST, betas=["fake-beta-2025-01-01"])
        assert isinstance(reply, anthropic.types.beta.BetaMessage)
        assert levels(limiter) == spent(1)
        with claude.beta.messages.stream(**REQUEST) as stream:
            assert levels(limiter)[1] == CAPACITY - OUTPUT - 300  # held while it streams
            assert "".join(stream.text_stream) == "fake reply"
        assert levels(limiter) == spent(2)
        events = claude.beta.messages.create(**REQUEST, stream=True)
        assert [event.type for event in events][-1] == "message_stop"
        assert levels(limiter) == spent(3)
        assert len(provider.bodies) == 3


def test_beta_messages_raw_and_streaming_responses_are_limited(daemon, provider):
    with Client(daemon.socket) as limiter:
        claude = claude_for(provider, limiter)
        answer = claude.beta.messages.with_raw_response.create(**REQUEST)
        assert answer.parse().usage.output_tokens == OUTPUT
        assert levels(limiter) == spent(1)
        with claude.beta.messages.with_streaming_response.create(**REQUEST) as response:
            response.parse()
        assert levels(limiter) == spent(2)


def test_a_copy_with_other_options_is_limited_too(daemon, provider):
    with Client(daemon.socket) as limiter:
        claude = claude_for(provider, limiter).with_options(timeout=5)
        assert claude.timeout == 5
        claude.messages.create(**REQUEST)
        assert levels(limiter) == spent(1)


def test_what_is_limited_does_not_warn_and_what_is_not_warns_once(daemon, provider):
    with Client(daemon.socket) as limiter:
        claude = claude_for(provider, limiter)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            for limited in (
                claude.messages.create,
                claude.messages.parse,
                claude.messages.stream,
                claude.messages.with_raw_response.create,
                claude.messages.with_streaming_response.create,
                claude.beta.messages.create,
                claude.beta.messages.with_raw_response.parse,
                claude.beta.messages.with_streaming_response.create,
                # Free, or spending nothing:
                claude.messages.count_tokens,
                claude.messages.with_raw_response.count_tokens,
                claude.beta.messages.count_tokens,
                claude.models,
                claude.beta.models,
            ):
                assert limited is not None
        for path, reach in (
            ("with_raw_response", lambda: claude.with_raw_response),
            ("with_streaming_response", lambda: claude.with_streaming_response),
            ("messages.batches", lambda: claude.messages.batches),
            (
                "messages.with_raw_response.batches",
                lambda: claude.messages.with_raw_response.batches,
            ),
            (
                "messages.with_streaming_response.batches",
                lambda: claude.messages.with_streaming_response.batches,
            ),
            ("beta.messages.batches", lambda: claude.beta.messages.batches),
            ("beta.messages.tool_runner", lambda: claude.beta.messages.tool_runner),
            ("beta.with_raw_response", lambda: claude.beta.with_raw_response),
            ("beta.sessions", lambda: claude.beta.sessions),
        ):
            with warnings.catch_warnings(record=True) as seen:
                warnings.simplefilter("always")
                assert reach() is not None
                reach()  # once per wrapped client and name
            assert [str(w.message).split(" of ")[0] for w in seen] == [f"ratekeeper: {path}"]
            (warning,) = seen
            assert warning.category is RuntimeWarning
            assert "not rate-limited" in str(warning.message)
            assert warning.filename == __file__  # it points at the caller's line


def test_asyncio_raw_streaming_and_beta(daemon, provider):
    async def main() -> tuple[int, int]:
        async with AsyncClient(daemon.socket) as limiter:
            raw = anthropic.AsyncAnthropic(base_url=provider.base_url, api_key="test-key")
            claude = wrap(raw, limiter, limit="claude")
            answer = await claude.messages.with_raw_response.create(**REQUEST)
            assert (await answer.parse()).usage.output_tokens == OUTPUT
            answer = await claude.messages.with_raw_response.create(**REQUEST, stream=True)
            events = [event.type async for event in await answer.parse()]
            assert events[-1] == "message_stop"
            async with claude.messages.with_streaming_response.create(**REQUEST) as response:
                await response.parse()
            async with claude.beta.messages.with_streaming_response.create(
                **REQUEST, stream=True
            ) as response:
                assert [e.type async for e in await response.parse()][-1] == "message_stop"
            reply = await claude.beta.messages.create(**REQUEST)
            assert reply.usage.output_tokens == OUTPUT
            async with claude.beta.messages.stream(**REQUEST) as stream:
                await stream.get_final_message()
            await raw.close()
            status = (await limiter.status("claude")).limit("claude")
            return status.bucket("input_tokens").level, status.bucket("output_tokens").level

    assert asyncio.run(asyncio.wait_for(main(), TIMEOUT)) == spent(6)
