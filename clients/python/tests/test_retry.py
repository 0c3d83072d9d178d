"""`ratekeeper.retry` with the real tenacity and the real daemon: waits from `retry_after`."""

from __future__ import annotations

import asyncio

import pytest
import tenacity

from ratekeeper import Client, RateLimited, SidecarUnavailable, UnknownLimit
from ratekeeper.retry import is_retryable, retry_after, retry_if_retryable, wait_retry_after

CONFIG = """
[[limits]]
name = "slow"
tokens_per_minute = 60
burst_tokens = 10
burst_headroom_ms = 0
"""


class Sleeps(list):
    """tenacity's `sleep=`: records the waits instead of sleeping them."""

    def __call__(self, seconds: float) -> None:
        self.append(seconds)


def test_a_denial_is_retried_after_its_retry_after(make_daemon):
    client = Client(make_daemon(CONFIG).socket)
    client.acquire("slow", 10).report(10)  # the burst is spent: one token a second
    sleeps = Sleeps()
    retrying = tenacity.Retrying(
        retry=retry_if_retryable,
        wait=wait_retry_after(),
        stop=tenacity.stop_after_attempt(3),
        sleep=sleeps,
        reraise=True,
    )
    with pytest.raises(RateLimited) as caught:
        retrying(client.acquire, "slow", 5, max_wait=0)
    assert len(sleeps) == 2
    # Each wait is what the daemon's denial said: about 5 s for 5 tokens at 1/s.
    assert all(4.0 < wait <= 5.0 for wait in sleeps), sleeps
    assert caught.value.retry_after <= sleeps[0]


def test_an_error_that_cannot_pass_is_not_retried(make_daemon):
    client = Client(make_daemon(CONFIG).socket)
    sleeps = Sleeps()
    retrying = tenacity.Retrying(
        retry=retry_if_retryable, wait=wait_retry_after(), sleep=sleeps, reraise=True
    )
    with pytest.raises(UnknownLimit):
        retrying(client.acquire, "no-such-limit", 5)
    assert sleeps == []


def test_errors_without_a_delay_wait_the_fallback(tmp_path):
    client = Client(tmp_path / "nobody.sock")
    sleeps = Sleeps()
    retrying = tenacity.Retrying(
        retry=retry_if_retryable,
        wait=wait_retry_after(fallback=tenacity.wait_fixed(0.25)),
        stop=tenacity.stop_after_attempt(3),
        sleep=sleeps,
        reraise=True,
    )
    with pytest.raises(SidecarUnavailable):
        retrying(client.ping)
    assert sleeps == [0.25, 0.25]


def test_they_combine_with_tenacitys_own(tmp_path):
    client = Client(tmp_path / "nobody.sock")
    sleeps = Sleeps()
    retrying = tenacity.Retrying(
        retry=tenacity.retry_if_exception_type(KeyError) | retry_if_retryable,
        wait=tenacity.wait_fixed(1) + wait_retry_after(fallback=2),
        stop=tenacity.stop_after_attempt(2),
        sleep=sleeps,
        reraise=True,
    )
    with pytest.raises(SidecarUnavailable):
        retrying(client.ping)
    assert sleeps == [3.0]


def test_asyncio_retrying(make_daemon):
    from ratekeeper import AsyncClient

    daemon = make_daemon(CONFIG)

    async def main() -> list[float]:
        client = AsyncClient(daemon.socket)
        await (await client.acquire("slow", 10)).report(10)
        waits: list[float] = []

        async def record(seconds: float) -> None:
            waits.append(seconds)

        retrying = tenacity.AsyncRetrying(
            retry=retry_if_retryable,
            wait=wait_retry_after(maximum=2.5),
            stop=tenacity.stop_after_attempt(2),
            sleep=record,
            reraise=True,
        )
        with pytest.raises(RateLimited):
            await retrying(client.acquire, "slow", 5, max_wait=0)
        await client.close()
        return waits

    assert asyncio.run(main()) == [2.5]  # capped


@pytest.mark.parametrize(
    ("error", "retryable", "delay"),
    [
        (RateLimited(1.5, "tokens"), True, 1.5),
        (SidecarUnavailable("down"), True, None),
        (UnknownLimit("typo"), False, None),
        (TimeoutError(), False, None),
        (None, False, None),
    ],
)
def test_what_the_errors_say(error, retryable, delay):
    assert is_retryable(error) is retryable
    assert retry_after(error) == delay


def test_the_wait_strategy_checks_its_bounds():
    with pytest.raises(ValueError, match="fallback"):
        wait_retry_after(fallback=-1)
    with pytest.raises(ValueError, match="maximum"):
        wait_retry_after(maximum=float("nan"))
