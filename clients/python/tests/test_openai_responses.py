"""The OpenAI wrapper's Responses and Embeddings, with the real `openai` package,
the real daemon and the fake provider: what each call reserves, that its
usage is reported, that a provider 429 is retried and a stream settles at
its end; sync and asyncio."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess

import openai
import pytest

from ratekeeper import AsyncClient, Client
from ratekeeper._core import openai as calls
from ratekeeper.openai import wrap

from _daemon import daemon_binary
from _fake_openai import FakeProvider

#: "counted" counts with gpt-4o-mini's tokenizer, as `count-tokens --model` does;
#: it barely refills, so levels can be asserted exactly.
CONFIG = """
[[limits]]
name = "counted"
model = "gpt-4o-mini"
tokens_per_minute = 1
burst_tokens = 1000000
"""
CAPACITY = 1_000_000
LIMIT = "counted"
MODEL = "gpt-4o-mini"

#: A Responses request with every input item the wrapper counts.
REQUEST = {
    "instructions": "Answer in one short sentence.",
    "input": [
        {"role": "developer", "content": "Use the weather tool."},
        {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": "What is the weather in Paris?"}],
        },
        {
            "type": "function_call",
            "call_id": "c1",
            "name": "weather",
            "arguments": '{"city":"Paris"}',
        },
        {"type": "function_call_output", "call_id": "c1", "output": "18C and sunny"},
        {
            "role": "assistant",
            "content": [{"type": "output_text", "text": "It is 18C.", "annotations": []}],
        },
    ],
    "tools": [
        {
            "type": "function",
            "name": "weather",
            "description": "The weather in a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
            "strict": True,
        }
    ],
    "max_output_tokens": 60,
}


@pytest.fixture
def daemon(make_daemon):
    return make_daemon(CONFIG)


def level(limiter: Client) -> int:
    return limiter.status(LIMIT).limit(LIMIT).bucket("tokens").level


async def async_level(limiter: AsyncClient) -> int:
    return (await limiter.status(LIMIT)).limit(LIMIT).bucket("tokens").level


def counted_by_the_daemon(request: dict) -> int:
    """What `ratekeeper count-tokens` reserves for a Responses request (prompt + output)."""
    answer = subprocess.run(
        [str(daemon_binary()), "count-tokens", "--model", MODEL],
        input=json.dumps({"model": MODEL, **request}),
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return int(re.search(r"^reserved: (\d+)", answer, re.MULTILINE).group(1))


def prompt(limiter: Client, text: str) -> int:
    """The daemon's count of one user message of `text`, without output."""
    messages = [{"role": "user", "content": text}]
    estimate = limiter.estimate(LIMIT, messages=messages, max_tokens=0)
    assert estimate.output_tokens == 0
    return estimate.input_tokens


def llm_for(provider: FakeProvider, limiter: Client, **options) -> openai.OpenAI:
    raw = openai.OpenAI(base_url=provider.base_url, api_key="test-key", max_retries=2)
    return wrap(raw, limiter, limit=LIMIT, **options)


def used(usage) -> int:
    return usage.input_tokens + usage.output_tokens


def test_a_response_reserves_what_the_daemon_counts_and_settles_when_its_stream_ends(
    daemon, provider
):
    reserved = counted_by_the_daemon(REQUEST)
    with Client(daemon.socket) as limiter:
        llm = llm_for(provider, limiter)
        stream = llm.responses.create(model=MODEL, stream=True, **REQUEST)
        # Acquired with the daemon's own reading of the Responses shape.
        assert level(limiter) == CAPACITY - reserved
        events = [event.type for event in stream]
        assert events[0] == "response.created"
        assert events[-1] == "response.completed"
        assert "response.output_text.delta" in events
        usage = provider.last_usage
        assert usage["output_tokens"] < 60
        # Settled at the end with the usage of response.completed.
        assert level(limiter) == CAPACITY - usage["input_tokens"] - usage["output_tokens"]


def test_a_response_reports_its_usage(daemon, provider):
    with Client(daemon.socket) as limiter:
        llm = llm_for(provider, limiter)
        reply = llm.responses.create(model=MODEL, input="Hello", max_output_tokens=50)
        assert reply.output_text == "fake reply"
        assert provider.bodies[-1]["input"] == "Hello"
        assert level(limiter) == CAPACITY - used(reply.usage)
        parsed = llm.responses.parse(model=MODEL, input="Hello again", max_output_tokens=50)
        assert level(limiter) == CAPACITY - used(reply.usage) - used(parsed.usage)


def prompt_of(request: dict) -> int:
    """What a 429'd Responses request keeps: its prompt (the output goes back)."""
    return counted_by_the_daemon(request) - request["max_output_tokens"]


def test_a_response_429_keeps_its_prompt_and_is_retried(daemon, provider):
    provider.force(429, count=2, retry_after_ms="50")
    with Client(daemon.socket) as limiter:
        llm = llm_for(provider, limiter, feedback_interval=None)
        reply = llm.responses.create(model=MODEL, input="Hello", max_output_tokens=50)
        assert len(provider.bodies) == 3
        refused = 2 * prompt_of({"input": "Hello", "max_output_tokens": 50})
        assert level(limiter) == CAPACITY - used(reply.usage) - refused


def test_a_refused_response_is_released_and_a_server_error_keeps_its_reservation(daemon, provider):
    request = {"input": "Hello", "max_output_tokens": 40}
    with Client(daemon.socket) as limiter:
        llm = llm_for(provider, limiter)
        provider.force(400)
        with pytest.raises(openai.BadRequestError):
            llm.responses.create(model=MODEL, **request)
        assert level(limiter) == CAPACITY
        provider.force(500)
        with pytest.raises(openai.InternalServerError):
            llm.responses.create(model=MODEL, **request)
        assert level(limiter) == CAPACITY - counted_by_the_daemon(request)


@pytest.mark.parametrize(
    ("input_", "refused"),
    [
        ([{"type": "reasoning", "id": "rs_1", "summary": []}], r"input\[0\]: .*'reasoning'"),
        (["Hello"], r"input\[0\]: an input item must be an object"),
        (
            [{"role": "user", "content": "Hi"}, {"type": "item_reference", "id": "msg_1"}],
            r"input\[1\]: .*'item_reference'",
        ),
        (
            [{"role": "user", "content": [{"type": "input_file", "file_id": "file-1"}]}],
            r"input\[0\].content\[0\]: .*'input_file'",
        ),
    ],
)
def test_an_input_it_cannot_count_is_refused_before_anything_is_spent(
    daemon, provider, input_, refused
):
    with Client(daemon.socket) as limiter:
        llm = llm_for(provider, limiter)
        with pytest.raises(ValueError, match=refused):
            llm.responses.create(model=MODEL, input=input_)
        assert provider.bodies == []
        assert level(limiter) == CAPACITY


def test_the_stream_helper_settles_when_it_is_left(daemon, provider):
    request = {"input": "Hello", "max_output_tokens": 50}
    with Client(daemon.socket) as limiter:
        llm = llm_for(provider, limiter)
        with llm.responses.stream(model=MODEL, **request) as stream:
            assert level(limiter) == CAPACITY - counted_by_the_daemon(request)
            text = "".join(e.delta for e in stream if e.type == "response.output_text.delta")
            final = stream.get_final_response()
        assert text == "fake streamed reply"
        assert level(limiter) == CAPACITY - used(final.usage)
        # Left before its end: the whole reservation is kept.
        with llm.responses.stream(model=MODEL, **request) as stream:
            next(iter(stream))
        assert level(limiter) == CAPACITY - used(final.usage) - counted_by_the_daemon(request)


def test_embeddings_reserve_their_texts_and_report_their_usage(daemon, provider):
    texts = ["The quick brown fox", "jumps over the lazy dog", "again and again"]
    with Client(daemon.socket) as limiter:
        llm = llm_for(provider, limiter)
        # What the daemon counts for each text alone, and for a message's framing.
        framing = prompt(limiter, "")
        alone = [prompt(limiter, text) for text in texts]
        provider.force(500)
        with pytest.raises(openai.InternalServerError):
            llm.embeddings.create(model="text-embedding-3-small", input=texts)
        # Kept: every text counted by the daemon's tokenizer, framed once, no output.
        reserved = sum(alone) - (len(texts) - 1) * framing
        assert level(limiter) == CAPACITY - reserved
        # Not forwarded: a pause of this barely refilling limit would last minutes.
        llm = llm_for(provider, limiter, feedback_interval=None)
        provider.force(429, retry_after_ms="50")
        reply = llm.embeddings.create(model="text-embedding-3-small", input=texts)
        assert [len(item.embedding) for item in reply.data] == [4, 4, 4]
        assert len(provider.bodies) == 3  # the 429 was retried
        # The refused attempt keeps its texts (embeddings reserve no output).
        assert level(limiter) == CAPACITY - 2 * reserved - reply.usage.prompt_tokens


@pytest.mark.parametrize(
    ("input_", "tokens"),
    [([1, 2, 3, 4, 5], 5), ([[1, 2, 3], [4, 5], [6]], 6), ((t for t in [7, 8]), 2)],
    ids=["ids", "lists of ids", "a generator"],
)
def test_embeddings_of_token_ids_reserve_exactly_their_length(daemon, provider, input_, tokens):
    with Client(daemon.socket) as limiter:
        llm = llm_for(provider, limiter)
        provider.force(500)
        with pytest.raises(openai.InternalServerError):
            llm.embeddings.create(model="text-embedding-3-small", input=input_)
        assert level(limiter) == CAPACITY - tokens
        assert provider.bodies[-1]["input"] in ([1, 2, 3, 4, 5], [[1, 2, 3], [4, 5], [6]], [7, 8])


def test_asyncio_responses_and_embeddings(daemon, provider):
    request = {"input": "Hello", "max_output_tokens": 50}
    reserved = counted_by_the_daemon(request)

    async def main():
        async with AsyncClient(daemon.socket) as limiter:
            raw = openai.AsyncOpenAI(base_url=provider.base_url, api_key="test-key")
            llm = wrap(raw, limiter, limit=LIMIT, feedback_interval=None)
            spent = 0
            provider.force(429, retry_after_ms="50")
            reply = await llm.responses.create(model=MODEL, **request)
            spent += used(reply.usage) + prompt_of(request)  # the refused one's prompt
            assert len(provider.bodies) == 2
            assert await async_level(limiter) == CAPACITY - spent

            stream = await llm.responses.create(model=MODEL, stream=True, **request)
            assert await async_level(limiter) == CAPACITY - spent - reserved
            events = [event.type async for event in stream]
            assert events[-1] == "response.completed"
            spent += provider.last_usage["total_tokens"]
            assert await async_level(limiter) == CAPACITY - spent

            async with llm.responses.stream(model=MODEL, **request) as helper:
                assert await async_level(limiter) == CAPACITY - spent - reserved
                final = await helper.get_final_response()
            spent += used(final.usage)
            assert await async_level(limiter) == CAPACITY - spent

            provider.force(429, retry_after_ms="50")
            served = len(provider.bodies)
            embedded = await llm.embeddings.create(model="text-embedding-3-small", input="Hi")
            assert len(provider.bodies) == served + 2
            hi = await limiter.estimate(LIMIT, messages=[{"role": "user", "content": "Hi"}])
            spent += embedded.usage.prompt_tokens + hi.input_tokens  # + the refused one's
            assert await async_level(limiter) == CAPACITY - spent
            await raw.close()

    asyncio.run(asyncio.wait_for(main(), 30))


#: Responses input (and instructions) → the chat messages the daemon counts.
MAPPING = [
    ({"input": "Hi"}, [{"role": "user", "content": "Hi"}]),
    (
        {"instructions": "Be brief.", "input": [{"role": "user", "content": "Hi"}]},
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
    ),
    (
        {"input": [{"type": "message", "role": "assistant", "content": [
            {"type": "output_text", "text": "No.", "annotations": []},
            {"type": "refusal", "refusal": "I can't."},
        ]}]},
        [{"role": "assistant", "content": [
            {"type": "text", "text": "No."}, {"type": "text", "text": "I can't."},
        ]}],
    ),
    (
        {"input": [{"role": "user", "content": [
            {"type": "input_image", "image_url": "https://x/y.png", "detail": "low"},
            {"type": "input_image", "file_id": "file-1", "detail": "auto"},
        ]}]},
        [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "https://x/y.png", "detail": "low"}},
            {"type": "image_url", "image_url": {"url": "", "detail": "auto"}},
        ]}],
    ),
    (
        {"input": [
            {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c", "output": "42"},
        ]},
        [
            {"role": "assistant", "tool_calls": [{"arguments": "{}", "name": "f"}]},
            {"role": "tool", "content": "42"},
        ],
    ),
]  # fmt: skip


@pytest.mark.parametrize(("request_", "messages"), MAPPING)
def test_responses_input_becomes_the_messages_the_daemon_reads(request_, messages):
    assert calls.RESPONSES.cost(dict(request_)).messages == messages


def test_a_previous_replys_output_items_count_as_input(daemon, provider):
    with Client(daemon.socket) as limiter:
        llm = llm_for(provider, limiter)
        first = llm.responses.create(model=MODEL, input="Hello", max_output_tokens=50)
        spent = used(first.usage)
        follow_up = [{"role": "user", "content": "Hello"}, *first.output]
        follow_up.append({"role": "user", "content": "And then?"})
        provider.force(500)
        with pytest.raises(openai.InternalServerError):
            llm.responses.create(model=MODEL, input=follow_up, max_output_tokens=50)
        as_json = [item if isinstance(item, dict) else item.model_dump() for item in follow_up]
        reserved = counted_by_the_daemon({"input": as_json, "max_output_tokens": 50})
        assert level(limiter) == CAPACITY - spent - reserved


def test_an_input_image_is_priced_as_an_image(daemon, provider):
    image = {"type": "input_image", "image_url": "https://example.com/cat.png", "detail": "high"}
    text = {"type": "input_text", "text": "What is this?"}
    with Client(daemon.socket) as limiter:
        llm = llm_for(provider, limiter)
        provider.force(500, count=2)
        for content in ([text], [text, image]):
            with pytest.raises(openai.InternalServerError):
                llm.responses.create(
                    model=MODEL, input=[{"role": "user", "content": content}], max_output_tokens=10
                )
        text_only = counted_by_the_daemon(
            {"input": [{"role": "user", "content": [text]}], "max_output_tokens": 10}
        )
        with_image = CAPACITY - level(limiter) - text_only
        # An image by URL is priced as the largest image (high detail): well above its text.
        assert with_image > text_only + 500
