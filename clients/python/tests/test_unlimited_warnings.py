"""Both wrappers, blocking and asyncio: reaching a part of the SDK client that
spends tokens unlimited warns once, and the warning names the caller's line
(this file), never the wrapper's `__getattr__` that noticed it. No daemon and
no provider: nothing is called, the attributes are only reached."""

from __future__ import annotations

import warnings
from typing import Any, Callable

import anthropic
import openai
import pytest

import ratekeeper.anthropic
import ratekeeper.openai
from ratekeeper import AsyncClient, Client

Reach = Callable[[Any], Any]

#: (what the warning names, how the caller reaches it) for each wrapper.
OPENAI: list[tuple[str, Reach]] = [
    ("completions", lambda llm: llm.completions),
    ("with_raw_response", lambda llm: llm.with_raw_response),
    ("chat.with_streaming_response", lambda llm: llm.chat.with_streaming_response),
    ("responses.compact", lambda llm: llm.responses.compact),
    ("responses.with_raw_response.compact", lambda llm: llm.responses.with_raw_response.compact),
    (
        "responses.with_streaming_response.compact",
        lambda llm: llm.responses.with_streaming_response.compact,
    ),
]
ANTHROPIC: list[tuple[str, Reach]] = [
    ("with_streaming_response", lambda claude: claude.with_streaming_response),
    ("messages.batches", lambda claude: claude.messages.batches),
    (
        "messages.with_raw_response.batches",
        lambda claude: claude.messages.with_raw_response.batches,
    ),
    (
        "messages.with_streaming_response.batches",
        lambda claude: claude.messages.with_streaming_response.batches,
    ),
    ("beta.messages.tool_runner", lambda claude: claude.beta.messages.tool_runner),
    ("beta.sessions", lambda claude: claude.beta.sessions),
]


def wrapped(provider: str, is_async: bool) -> Any:
    limiter = AsyncClient("/nonexistent.sock") if is_async else Client("/nonexistent.sock")
    if provider == "openai":
        sdk = openai.AsyncOpenAI if is_async else openai.OpenAI
        return ratekeeper.openai.wrap(sdk(api_key="test-key"), limiter, limit="gpt")
    sdk = anthropic.AsyncAnthropic if is_async else anthropic.Anthropic
    return ratekeeper.anthropic.wrap(sdk(api_key="test-key"), limiter, limit="claude")


CASES = [
    pytest.param(provider, is_async, path, reach, id=f"{provider}-{kind}-{path}")
    for provider, surfaces in (("openai", OPENAI), ("anthropic", ANTHROPIC))
    for is_async, kind in ((False, "blocking"), (True, "asyncio"))
    for path, reach in surfaces
]


@pytest.mark.parametrize(("provider", "is_async", "path", "reach"), CASES)
def test_an_unlimited_part_warns_once_at_the_callers_line(provider, is_async, path, reach):
    client = wrapped(provider, is_async)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert reach(client) is not None
        reach(client)  # once per wrapped client and name
    assert [str(w.message).split(" of ")[0] for w in seen] == [f"ratekeeper: {path}"]
    (warning,) = seen
    assert warning.category is RuntimeWarning
    assert warning.filename == __file__, f"the warning names {warning.filename}:{warning.lineno}"
