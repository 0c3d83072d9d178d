"""Checked by mypy in `test_typing.py`, never run: `wrap` keeps the client's type.

Each `# type: ignore[...]` marks an error mypy must find; the check runs with
`--warn-unused-ignores`, so an ignore mypy finds no error for fails it. Were
`wrap` typed as returning `Any`, every `assert_type` below and every marked
line would fail the check.
"""

from __future__ import annotations

import openai
from openai.types import CreateEmbeddingResponse
from openai.types.chat import ChatCompletion
from openai.types.responses import Response
from typing_extensions import assert_type

from ratekeeper import AsyncClient, Client
from ratekeeper.openai import wrap

MESSAGES: list[openai.types.chat.ChatCompletionMessageParam] = [{"role": "user", "content": "Hi"}]


def blocking() -> None:
    llm = wrap(openai.OpenAI(), Client(), limit="gpt-4o-mini")
    assert_type(llm, openai.OpenAI)
    reply = llm.chat.completions.create(model="gpt-4o-mini", messages=MESSAGES)
    assert_type(reply, ChatCompletion)
    assert_type(llm.responses.create(model="gpt-4o-mini", input="Hi"), Response)
    embedded = llm.embeddings.create(model="text-embedding-3-small", input="Hi")
    assert_type(embedded, CreateEmbeddingResponse)
    llm.chat.completions.create(model="gpt-4o-mini", message=MESSAGES)  # type: ignore[call-overload]
    llm.responses.create(model="gpt-4o-mini", input=42)  # type: ignore[call-overload]


async def asyncio() -> None:
    llm = wrap(openai.AsyncOpenAI(), AsyncClient(), limit="gpt-4o-mini")
    assert_type(llm, openai.AsyncOpenAI)
    reply = await llm.chat.completions.create(model="gpt-4o-mini", messages=MESSAGES)
    assert_type(reply, ChatCompletion)


def not_a_number() -> int:
    return wrap(openai.OpenAI(), Client(), limit="x")  # type: ignore[return-value]


def not_blocking() -> openai.OpenAI:
    return wrap(openai.AsyncOpenAI(), AsyncClient(), limit="x")  # type: ignore[return-value]
