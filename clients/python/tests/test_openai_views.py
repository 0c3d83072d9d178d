"""The OpenAI wrapper's other ways into the limited calls, with the real `openai`
package, the real daemon and the fake provider: `with_raw_response`,
`with_streaming_response`, `chat.completions.parse` and `.stream()`, and
`with_options`; and the warning for what stays unlimited."""

from __future__ import annotations

import asyncio
import warnings

import openai
import pytest

from ratekeeper import AsyncClient, Client
from ratekeeper.openai import wrap

from _fake_openai import FakeProvider

#: "gpt" barely refills, so levels can be asserted exactly; "slow" has room to
#: show a forwarded `remaining` count lowering it.
CONFIG = """
[[limits]]
name = "gpt"
tokens_per_minute = 1
burst_tokens = 1000000

[[limits]]
name = "slow"
tokens_per_minute = 60000
burst_tokens = 100000
"""
CAPACITY = 1_000_000
MESSAGES = [{"role": "user", "content": "Summarise the plot of Hamlet in one sentence."}]
CHAT = {"model": "gpt-4o-mini", "messages": MESSAGES, "max_tokens": 50}
RESPONSE = {"model": "gpt-4o-mini", "input": "Summarise Hamlet.", "max_output_tokens": 50}


@pytest.fixture
def daemon(make_daemon):
    return make_daemon(CONFIG)


def level(limiter: Client, limit: str = "gpt") -> int:
    return limiter.status(limit).limit(limit).bucket("tokens").level


def llm_for(provider: FakeProvider, limiter: Client, **options) -> openai.OpenAI:
    raw = openai.OpenAI(base_url=provider.base_url, api_key="test-key", max_retries=2)
    return wrap(raw, limiter, limit=options.pop("limit", "gpt"), **options)


def chat_reserved(limiter: Client) -> int:
    estimate = limiter.estimate("gpt", messages=MESSAGES, max_tokens=CHAT["max_tokens"])
    return estimate.input_tokens + estimate.output_tokens


def test_a_raw_completion_is_limited_and_always_forwards_its_headers(daemon, provider):
    with Client(daemon.socket) as limiter:
        # A sample per hour: only the first plain answer's headers go out.
        llm = llm_for(provider, limiter, limit="slow", feedback_interval=3600)
        llm.chat.completions.create(**CHAT)
        provider.force(200, x_ratelimit_remaining_tokens="1000")
        llm.chat.completions.create(**CHAT)
        assert level(limiter, "slow") > 90000  # not sampled: not forwarded
        provider.force(200, x_ratelimit_remaining_tokens="1000")
        answer = llm.chat.completions.with_raw_response.create(**CHAT)
        assert answer.headers["x-ratelimit-remaining-tokens"] == "1000"
        assert answer.parse().choices[0].message.content == "fake reply"
        # Forwarded although no sample was due: the bucket follows the provider's count.
        assert level(limiter, "slow") < 50000


def test_raw_answers_report_their_usage(daemon, provider):
    with Client(daemon.socket) as limiter:
        llm = llm_for(provider, limiter)
        spent = llm.chat.completions.with_raw_response.create(**CHAT).parse().usage.total_tokens
        assert level(limiter) == CAPACITY - spent
        reply = llm.responses.with_raw_response.create(**RESPONSE).parse()
        spent += reply.usage.total_tokens
        assert level(limiter) == CAPACITY - spent
        embedded = llm.embeddings.with_raw_response.create(model="e", input="Hello").parse()
        spent += embedded.usage.prompt_tokens
        assert level(limiter) == CAPACITY - spent
        # A raw stream: its parse() settles at the end, the usage chunk hidden.
        answer = llm.chat.completions.with_raw_response.create(**CHAT, stream=True)
        assert answer.headers["content-type"] == "text/event-stream"
        chunks = list(answer.parse())
        assert all(chunk.choices for chunk in chunks)
        spent += provider.last_usage["total_tokens"]
        assert level(limiter) == CAPACITY - spent


def test_a_streaming_response_settles_from_what_was_read_when_it_is_left(daemon, provider):
    with Client(daemon.socket) as limiter:
        llm = llm_for(provider, limiter)
        with llm.chat.completions.with_streaming_response.create(**CHAT) as response:
            assert level(limiter) == CAPACITY - chat_reserved(limiter)
            completion = response.parse()
        spent = completion.usage.total_tokens
        assert level(limiter) == CAPACITY - spent
        with llm.responses.with_streaming_response.create(**RESPONSE) as response:
            body = response.json()
        spent += body["usage"]["total_tokens"]
        assert level(limiter) == CAPACITY - spent
        with llm.embeddings.with_streaming_response.create(model="e", input="Hi") as response:
            response.read()
        spent += provider.last_usage["total_tokens"]
        assert level(limiter) == CAPACITY - spent
        # A stream's events, read through parse(); the usage chunk hidden.
        with llm.chat.completions.with_streaming_response.create(**CHAT, stream=True) as response:
            pieces = [chunk.choices[0].delta.content or "" for chunk in response.parse()]
        assert "".join(pieces) == "fake streamed reply"
        spent += provider.last_usage["total_tokens"]
        assert level(limiter) == CAPACITY - spent
        # Read as lines, the body's usage is not seen: the reservation is kept.
        with llm.responses.with_streaming_response.create(**RESPONSE, stream=True) as response:
            lines = list(response.iter_lines())
        assert any("response.completed" in line for line in lines)
        estimate = limiter.estimate("gpt", messages=[{"content": RESPONSE["input"]}], max_tokens=50)
        spent += estimate.input_tokens + estimate.output_tokens
        assert level(limiter) == CAPACITY - spent


def test_a_streaming_response_429_is_retried(daemon, provider):
    provider.force(429, count=2, retry_after_ms="50")
    with Client(daemon.socket) as limiter:
        llm = llm_for(provider, limiter, feedback_interval=None)
        with llm.chat.completions.with_streaming_response.create(**CHAT) as response:
            completion = response.parse()
        assert len(provider.bodies) == 3
        # The two refused attempts keep their prompt: the provider counts them.
        refused = 2 * limiter.estimate("gpt", messages=MESSAGES, max_tokens=1).input_tokens
        assert level(limiter) == CAPACITY - completion.usage.total_tokens - refused


def test_parse_and_the_stream_helper_of_chat_completions_are_limited(daemon, provider):
    with Client(daemon.socket) as limiter:
        llm = llm_for(provider, limiter)
        spent = llm.chat.completions.parse(**CHAT).usage.total_tokens
        assert level(limiter) == CAPACITY - spent
        with llm.chat.completions.stream(**CHAT) as stream:
            assert level(limiter) == CAPACITY - spent - chat_reserved(limiter)
            text = "".join(e.delta for e in stream if e.type == "content.delta")
        assert text == "fake streamed reply"
        assert provider.bodies[-1]["stream_options"] == {"include_usage": True}
        spent += stream.get_final_completion().usage.total_tokens
        assert level(limiter) == CAPACITY - spent


def test_a_copy_with_other_options_is_limited_too(daemon, provider):
    with Client(daemon.socket) as limiter:
        llm = llm_for(provider, limiter).with_options(timeout=5)
        assert llm.timeout == 5
        reply = llm.responses.create(**RESPONSE)
        assert level(limiter) == CAPACITY - reply.usage.total_tokens


def test_what_is_limited_does_not_warn_and_what_is_not_warns_once(daemon, provider):
    with Client(daemon.socket) as limiter:
        llm = llm_for(provider, limiter)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            for limited in (
                llm.chat.completions.create,
                llm.chat.completions.with_raw_response.create,
                llm.chat.completions.with_streaming_response.create,
                llm.responses.create,
                llm.responses.parse,
                llm.responses.with_raw_response.parse,
                llm.responses.with_streaming_response.create,
                llm.embeddings.create,
                llm.embeddings.with_raw_response.create,
                llm.models,  # spends nothing
                llm.responses.retrieve,
            ):
                assert limited is not None
        for reach in (
            lambda: llm.completions,
            lambda: llm.images,
            lambda: llm.with_raw_response,
            lambda: llm.chat.with_streaming_response,
            lambda: llm.responses.compact,
            lambda: llm.responses.with_raw_response.compact,
        ):
            with pytest.warns(RuntimeWarning, match="not rate-limited"):
                assert reach() is not None
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                reach()  # once per wrapped client and name


def test_asyncio_raw_and_streaming_responses(daemon, provider):
    async def main():
        async with AsyncClient(daemon.socket) as limiter:
            raw = openai.AsyncOpenAI(base_url=provider.base_url, api_key="test-key")
            llm = wrap(raw, limiter, limit="gpt")
            answer = await llm.chat.completions.with_raw_response.create(**CHAT)
            spent = answer.parse().usage.total_tokens
            answer = await llm.responses.with_raw_response.create(**RESPONSE, stream=True)
            events = [event.type async for event in answer.parse()]
            assert events[-1] == "response.completed"
            spent += provider.last_usage["total_tokens"]
            async with llm.embeddings.with_streaming_response.create(
                model="e", input=["Hi", "there"]
            ) as response:
                embedded = await response.parse()
            spent += embedded.usage.prompt_tokens
            async with llm.chat.completions.stream(**CHAT) as stream:
                final = await stream.get_final_completion()
            spent += final.usage.total_tokens
            status = await limiter.status("gpt")
            assert status.limit("gpt").bucket("tokens").level == CAPACITY - spent
            await raw.close()

    asyncio.run(asyncio.wait_for(main(), 30))
