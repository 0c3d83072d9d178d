"""Checked by mypy in `test_typing.py`, never run: `reserve` takes `acquire`'s
keywords by name and type, so a misspelled one is a type error.

Each `# type: ignore[...]` marks an error mypy must find; the check runs with
`--warn-unused-ignores`, so an ignore mypy finds no error for fails it. Were
`reserve` typed as taking `**options: Any`, every marked line would pass
unnoticed, and the check would fail on its ignores.
"""

from __future__ import annotations

from typing_extensions import assert_type

from ratekeeper import AsyncClient, AsyncLease, Client, Lease

MESSAGES = [{"role": "user", "content": "Hi"}]


def blocking(limiter: Client) -> None:
    with limiter.reserve(
        "gpt-4o-mini", 1200, max_tokens=300, tenant="acme", priority="batch", max_wait=5
    ) as lease:
        assert_type(lease, Lease)
    with limiter.reserve("claude", messages=MESSAGES, system="Be brief.", api="anthropic"):
        pass
    with limiter.reserve("gpt-4o-mini", tokns=1200):  # type: ignore[call-arg]
        pass
    with limiter.reserve("gpt-4o-mini", 1200, max_wait="5s"):  # type: ignore[arg-type]
        pass
    with limiter.reserve("gpt-4o-mini", messages=MESSAGES, api="gemini"):  # type: ignore[arg-type]
        pass


async def asyncio(limiter: AsyncClient) -> None:
    async with limiter.reserve("gpt-4o-mini", 1200, max_tokens=300, max_wait=5) as lease:
        assert_type(lease, AsyncLease)
    async with limiter.reserve("gpt-4o-mini", 1200, max_token=300):  # type: ignore[call-arg]
        pass
    async with limiter.reserve("gpt-4o-mini", 1200, tenant=7):  # type: ignore[arg-type]
        pass
