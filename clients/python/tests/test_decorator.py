"""`@client.limit(...)`: every call acquires first and settles after, against the real daemon."""

from __future__ import annotations

import asyncio

import pytest

from ratekeeper import AsyncClient, Client, RateLimited

CAPACITY = 1_000_000  # burst of the "exact" limit (one token a minute: levels are exact)


def level(client: Client, limit: str = "exact") -> int:
    return client.status(limit).limit(limit).bucket("tokens").level


@pytest.fixture
def limiter(make_daemon):
    with Client(make_daemon().socket) as client:
        yield client


def test_a_call_reserves_then_reports_its_usage(limiter):
    seen = []

    @limiter.limit("exact", tokens=400, max_tokens=600, usage=lambda used: (used, 20))
    def call(prompt_tokens: int) -> int:
        seen.append(level(limiter))  # during the call: the whole reservation is held
        return prompt_tokens

    assert call(380) == 380
    assert seen == [CAPACITY - 1000]
    assert level(limiter) == CAPACITY - 400  # settled to 380 + 20


def test_a_usage_with_cache_figures_settles_their_sum_as_input(limiter):
    @limiter.limit("exact", tokens=400, max_tokens=600, usage=lambda reply: reply)
    def call() -> tuple:
        # 100 full-price, 200 read from the cache, 50 written to it; 20 out.
        return (100, 20, 200, 50)

    call()
    # The "exact" limit has no provider: cache reads count towards it.
    assert level(limiter) == CAPACITY - (100 + 200 + 50 + 20)


def test_a_usage_of_three_figures_is_refused_and_keeps_the_reservation(limiter):
    @limiter.limit("exact", tokens=400, usage=lambda reply: (1, 2, 3))
    def call() -> None:
        return None

    with pytest.raises(ValueError, match="cached_input, cache_write"):
        call()
    assert level(limiter) == CAPACITY - 400


def test_a_total_usage_is_reported_as_one_count(limiter):
    @limiter.limit("exact", tokens=100, max_tokens=100, usage=lambda reply: reply["total"])
    def call() -> dict:
        return {"total": 150}

    call()
    assert level(limiter) == CAPACITY - 150


def test_without_usage_the_reservation_is_kept(limiter):
    @limiter.limit("exact", tokens=400, max_tokens=600)
    def call() -> str:
        return "done"

    assert call() == "done"
    assert level(limiter) == CAPACITY - 1000


def test_a_usage_of_none_keeps_the_reservation(limiter):
    @limiter.limit("exact", tokens=300, usage=lambda reply: None)
    def call() -> None:
        return None

    call()
    assert level(limiter) == CAPACITY - 300


def test_a_raising_function_releases_its_lease(limiter):
    @limiter.limit("exact", tokens=500)
    def call() -> None:
        raise KeyError("the provider was never called")

    with pytest.raises(KeyError):
        call()
    assert level(limiter) == CAPACITY


def test_a_failing_usage_keeps_the_reservation_and_raises(limiter):
    @limiter.limit("exact", tokens=500, usage=lambda reply: reply.usage)
    def call() -> object:
        return object()

    with pytest.raises(AttributeError):
        call()
    assert level(limiter) == CAPACITY - 500  # the call was made: its tokens stay spent


def test_tokens_and_messages_may_be_computed_from_the_arguments(limiter):
    @limiter.limit("exact", tokens=lambda text, *, extra=0: len(text) + extra)
    def by_count(text: str, *, extra: int = 0) -> str:
        return text

    by_count("x" * 70, extra=30)
    assert level(limiter) == CAPACITY - 100

    estimate = limiter.estimate("exact", messages=[{"role": "user", "content": "hello there"}])

    @limiter.limit("exact", messages=lambda text: [{"role": "user", "content": text}])
    def by_messages(text: str) -> str:
        return text

    by_messages("hello there")
    # Without max_tokens the daemon reserves the limit's default output as well.
    assert level(limiter) == CAPACITY - 100 - estimate.input_tokens - estimate.output_tokens


def test_a_denial_raises_before_the_function_runs(limiter):
    calls = []

    @limiter.limit("exact", tokens=CAPACITY, max_wait=0)
    def call() -> None:
        calls.append(1)

    call()
    with pytest.raises(RateLimited) as caught:
        call()
    assert caught.value.retry_after > 0
    assert calls == [1]


def test_the_decorated_function_keeps_its_name_and_docs(limiter):
    @limiter.limit("exact", tokens=1)
    def summarize(text: str) -> str:
        """Summarizes."""
        return text

    assert (summarize.__name__, summarize.__doc__) == ("summarize", "Summarizes.")


def test_what_cannot_be_limited_is_refused_at_decoration(limiter):
    async def coroutine() -> None:
        pass

    def plain() -> None:
        pass

    def generator():
        yield 1

    with pytest.raises(TypeError, match=r"use AsyncClient\.limit"):
        limiter.limit("exact", tokens=1)(coroutine)
    with pytest.raises(TypeError, match="generator"):
        limiter.limit("exact", tokens=1)(generator)
    with pytest.raises(TypeError, match=r"use Client\.limit"):
        AsyncClient(limiter.socket_path).limit("exact", tokens=1)(plain)
    with pytest.raises(TypeError, match="tokens must be an int"):
        limiter.limit("exact", tokens=1.5)  # type: ignore[arg-type]


def test_the_asyncio_client_limits_coroutine_functions(make_daemon):
    daemon = make_daemon()

    async def main() -> list[int]:
        client = AsyncClient(daemon.socket)

        @client.limit("exact", tokens=400, max_tokens=600, usage=lambda used: (used, 20))
        async def call(prompt_tokens: int) -> int:
            await asyncio.sleep(0)
            return prompt_tokens

        @client.limit("exact", tokens=500)
        async def failing() -> None:
            raise KeyError("never called the provider")

        async def tokens_level() -> int:
            status = await client.status("exact")
            return status.limit("exact").bucket("tokens").level

        levels = [await call(380), await tokens_level()]
        with pytest.raises(KeyError):
            await failing()
        levels.append(await tokens_level())
        await client.close()
        return levels

    assert asyncio.run(main()) == [380, CAPACITY - 400, CAPACITY - 400]
