"""A call the provider refused: what its lease keeps, by hand, in `reserve()`
and in the decorator, with the real daemon, the real SDKs (their own retries
off, so each call is one request) and the fake providers.

A 429 is settled as rejected (`settle_as_rejected`): rate limiters count
what they refuse, so the request and its input stay spent and only the
output, never generated, goes back where the limit refunds. A 529
(overloaded) and other 4xx are released, 5xx kept.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import urllib.error
import urllib.request

import anthropic
import openai
import pytest

from ratekeeper import AsyncClient, Client, SidecarUnavailableWarning

from _fake_anthropic import FakeAnthropic

#: Limits that barely refill, so levels can be asserted exactly: "refunding"
#: settles to usage (the `generic` preset's rule) and counts requests;
#: "keeping" is OpenAI's accounting (charge max(input, output), kept).
CONFIG = """
[[limits]]
name = "refunding"
tokens_per_minute = 1
burst_tokens = 1000000
requests_per_minute = 1
burst_requests = 1000
burst_headroom_ms = 0

[[limits]]
name = "keeping"
provider = "openai"
tokens_per_minute = 1
burst_tokens = 1000000
"""
CAPACITY = 1_000_000
REQUESTS = 1000
#: Every lease here: 100 tokens of input, 50 of output.
INPUT, OUTPUT = 100, 50
CHAT = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "Hi"}]}


@pytest.fixture
def daemon(make_daemon, store):
    return make_daemon(CONFIG, store=store)


def levels(limiter: Client, limit: str = "refunding") -> tuple[int, int]:
    """(tokens, requests) left in `limit` (requests: REQUESTS for "keeping")."""
    status = limiter.status(limit).limit(limit)
    requests = status.bucket("requests")
    return status.bucket("tokens").level, REQUESTS if requests is None else requests.level


def reserve(limiter: Client):
    """A lease of INPUT + OUTPUT on "refunding", as a context manager."""
    return limiter.reserve("refunding", INPUT, max_tokens=OUTPUT)


def raw_openai(provider) -> openai.OpenAI:
    """The SDK without its own retries: one provider request per call."""
    return openai.OpenAI(base_url=provider.base_url, api_key="k", max_retries=0, timeout=10)


def test_a_rejected_lease_keeps_its_request_and_input(daemon):
    with Client(daemon.socket, timeout=5) as limiter:
        lease = limiter.acquire("refunding", INPUT, max_tokens=OUTPUT)
        assert lease.settle_as_rejected() == OUTPUT  # the output goes back
        assert lease.settled
        assert levels(limiter) == (CAPACITY - INPUT, REQUESTS - 1)
        # OpenAI's accounting keeps its whole charge, max(100, 50), as OpenAI does.
        lease = limiter.acquire("keeping", INPUT, max_tokens=OUTPUT)
        assert lease.settle_as_rejected() == 0
        assert levels(limiter, "keeping")[0] == CAPACITY - INPUT


def test_an_unlimited_lease_settles_as_rejected_without_a_sidecar(tmp_path):
    with Client(tmp_path / "none.sock", on_unavailable="allow", timeout=1) as limiter:
        with pytest.warns(SidecarUnavailableWarning):
            lease = limiter.acquire("refunding", INPUT, max_tokens=OUTPUT)
        assert lease.settle_as_rejected() is None
        assert lease.settled


@pytest.mark.parametrize(
    ("status", "kept"),
    [
        (429, (INPUT, 1)),  # refused and counted: the request and its input stay
        (400, (0, 0)),  # refused before processing: released
        (500, (INPUT + OUTPUT, 1)),  # may have been processed: kept whole
    ],
)
def test_reserve_settles_by_the_providers_answer(daemon, provider, status, kept):
    provider.force(status)
    with Client(daemon.socket, timeout=5) as limiter:
        llm = raw_openai(provider)
        with pytest.raises(openai.APIStatusError), reserve(limiter):
            llm.chat.completions.create(**CHAT)
        assert levels(limiter) == (CAPACITY - kept[0], REQUESTS - kept[1])


def test_reserve_still_releases_when_the_body_fails_on_its_own(daemon):
    with Client(daemon.socket, timeout=5) as limiter:
        with pytest.raises(KeyError), reserve(limiter):
            raise KeyError("before any call")
        assert levels(limiter) == (CAPACITY, REQUESTS)


def httpx_module():
    """httpx, the HTTP client of the SDKs (packaged as httpx2 in some environments)."""
    for name in ("httpx", "httpx2"):
        with contextlib.suppress(ImportError):
            return importlib.import_module(name)
    pytest.skip("httpx is not installed")


def test_a_429_seen_through_httpx_or_urllib_is_rejected_too(daemon, provider):
    httpx = httpx_module()
    url = f"{provider.base_url}/chat/completions"
    provider.force(429, count=2)
    with Client(daemon.socket, timeout=5) as limiter:
        # httpx's HTTPStatusError (and requests' HTTPError): `response.status_code`.
        with pytest.raises(httpx.HTTPStatusError), reserve(limiter):
            httpx.post(url, json=CHAT, timeout=10).raise_for_status()
        # The standard library's HTTPError: `code`.
        request = urllib.request.Request(url, json.dumps(CHAT).encode(), method="POST")
        with pytest.raises(urllib.error.HTTPError), reserve(limiter):
            urllib.request.urlopen(request, timeout=10)
        assert levels(limiter) == (CAPACITY - 2 * INPUT, REQUESTS - 2)


def test_an_overloaded_anthropic_is_released(daemon):
    fake = FakeAnthropic()
    try:
        fake.force(529, retry_after="0")
        claude = anthropic.Anthropic(base_url=fake.base_url, api_key="k", max_retries=0, timeout=10)
        with Client(daemon.socket, timeout=5) as limiter:
            with pytest.raises(anthropic.APIStatusError) as failed, reserve(limiter):
                claude.messages.create(
                    model="claude-sonnet-4-6", max_tokens=OUTPUT, messages=CHAT["messages"]
                )
            assert failed.value.status_code == 529
            assert levels(limiter) == (CAPACITY, REQUESTS)
    finally:
        fake.close()


def test_the_decorator_keeps_what_a_429_counted(daemon, provider):
    with Client(daemon.socket, timeout=5) as limiter:
        llm = raw_openai(provider)

        @limiter.limit("refunding", tokens=INPUT, max_tokens=OUTPUT)
        def ask() -> object:
            return llm.chat.completions.create(**CHAT)

        provider.force(429)
        with pytest.raises(openai.RateLimitError):
            ask()
        assert levels(limiter) == (CAPACITY - INPUT, REQUESTS - 1)


def test_settle_failed_applies_the_wrappers_rule(daemon, provider):
    with Client(daemon.socket, timeout=5) as limiter:
        provider.force(429)
        lease = limiter.acquire("refunding", INPUT, max_tokens=OUTPUT)
        with pytest.raises(openai.RateLimitError) as refused:
            raw_openai(provider).chat.completions.create(**CHAT)
        assert lease.settle_failed(refused.value) == OUTPUT
        assert levels(limiter) == (CAPACITY - INPUT, REQUESTS - 1)
        # No answer at all (a timeout) from a call that was made: it may have
        # been processed, so it keeps its reservation, unless it was not made.
        limiter.acquire("refunding", INPUT, max_tokens=OUTPUT).settle_failed(TimeoutError())
        assert levels(limiter) == (CAPACITY - 2 * INPUT - OUTPUT, REQUESTS - 2)
        unmade = limiter.acquire("refunding", INPUT, max_tokens=OUTPUT)
        assert unmade.settle_failed(TimeoutError(), called=False) == INPUT + OUTPUT
        assert levels(limiter) == (CAPACITY - 2 * INPUT - OUTPUT, REQUESTS - 2)


def test_asyncio_reserve_and_decorator_keep_what_a_429_counted(daemon, provider):
    async def main() -> None:
        async with AsyncClient(daemon.socket, timeout=5) as limiter:
            llm = openai.AsyncOpenAI(
                base_url=provider.base_url, api_key="k", max_retries=0, timeout=10
            )
            provider.force(429, count=2)
            with pytest.raises(openai.RateLimitError):
                async with limiter.reserve("refunding", INPUT, max_tokens=OUTPUT):
                    await llm.chat.completions.create(**CHAT)

            @limiter.limit("refunding", tokens=INPUT, max_tokens=OUTPUT)
            async def ask() -> object:
                return await llm.chat.completions.create(**CHAT)

            with pytest.raises(openai.RateLimitError):
                await ask()
            lease = await limiter.acquire("refunding", INPUT, max_tokens=OUTPUT)
            assert await lease.settle_as_rejected() == OUTPUT
            status = (await limiter.status("refunding")).limit("refunding")
            assert status.bucket("tokens").level == CAPACITY - 3 * INPUT
            assert status.bucket("requests").level == REQUESTS - 3
            await llm.close()

    asyncio.run(asyncio.wait_for(main(), 30))
