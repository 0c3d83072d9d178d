"""tests/fixtures/requests.json, held against `Client.estimate` (issue 28).

The fixture is a table of provider requests (OpenAI Chat Completions and
Responses, Anthropic Messages; text, images, tools, the issue's 11 KB system
prompt and 2.4 KB tool result) with the prompt tokens the daemon counts for
each under each preset. Here every request goes through what the client's
wrappers do with it (`_core.anthropic.cost`, `_core.openai.RESPONSES.cost`,
the Chat Completions arguments) into `Client.estimate` of a real daemon;
`tests/it/request_shapes.rs` runs `ratekeeper count-tokens` on the same JSON.
Both must find the fixture's numbers.

`RATEKEEPER_WRITE_REQUESTS=1` rewrites the fixture from `build_cases()` with
the counts the daemon gives; review the diff: a changed count is a change in
what is reserved.
"""

from __future__ import annotations

import base64
import json
import os
import struct
from pathlib import Path
from typing import Any, Optional

import pytest

from ratekeeper import Client
from ratekeeper._core import anthropic as anthropic_core
from ratekeeper._core import openai as calls

FIXTURE = Path(__file__).resolve().parents[3] / "tests" / "fixtures" / "requests.json"

#: Each preset: the `count-tokens` arguments, and the daemon limit that counts alike.
PRESETS = {
    "anthropic": {"provider": "anthropic", "model": "claude-sonnet-4-5"},
    "openai": {"provider": "openai", "model": "gpt-4o"},
    "o200k_base": {"provider": "generic", "model": "gpt-4o"},
    "cl100k_base": {"provider": "generic", "model": "gpt-4"},
}


def daemon_config() -> str:
    return "".join(
        f'[[limits]]\nname = "{name}"\nprovider = "{preset["provider"]}"\n'
        f'model = "{preset["model"]}"\ntokens_per_minute = 100000000\n\n'
        for name, preset in PRESETS.items()
    )


# ---------------------------------------------------------------------------
# The requests
# ---------------------------------------------------------------------------

_WORDS = [
    "the",
    "limit",
    "every",
    "worker",
    "shares",
    "is",
    "kept",
    "by",
    "one",
    "daemon",
    "which",
    "counts",
    "each",
    "request",
    "before",
    "it",
    "reaches",
    "the",
    "provider",
    "so",
    "that",
    "bursts",
    "wait",
    "instead",
    "of",
    "failing",
    "with",
    "a",
    "429",
    "tokens",
    "input",
    "output",
    "reservation",
    "settle",
    "report",
    "tenant",
    "priority",
    "bucket",
    "refill",
    "minute",
]


def prose(size: int, seed: int) -> str:
    """Deterministic English-like text of exactly `size` bytes (a linear congruential
    generator picks the words), sentences and paragraphs included."""
    state = seed
    words: list[str] = []
    length = 0
    while length < size:
        state = (state * 1103515245 + 12345) % 2**31
        word = _WORDS[state % len(_WORDS)]
        if state % 11 == 0:
            word += "."
        if state % 97 == 0:
            word += "\n\n"
        words.append(word)
        length += len(word) + 1
    return " ".join(words)[:size]


def table_rows(size: int) -> str:
    """A tool's result: CSV-like rows with numbers, `size` bytes."""
    rows = []
    index = 0
    while sum(len(row) + 1 for row in rows) < size:
        rows.append(
            f"{index},order-{index * 7919 % 100003},{index * 37 % 1000}.{index % 100:02d},ok"
        )
        index += 1
    return "\n".join(rows)[:size]


def png_base64(width: int, height: int) -> str:
    """Base64 of a PNG's first bytes (signature and IHDR): enough to read its size."""
    header = b"\x89PNG\r\n\x1a\n" + struct.pack(">I", 13) + b"IHDR"
    header += struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return base64.b64encode(header + b"\x00" * 4).decode()


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "The city."},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}

ANTHROPIC_TOOL = {
    "name": "run_query",
    "description": "Runs a read-only SQL query against the orders database.",
    "input_schema": {
        "type": "object",
        "properties": {"sql": {"type": "string", "description": "One SELECT statement."}},
        "required": ["sql"],
    },
}


def build_cases() -> list[dict]:
    png = png_base64(1024, 768)
    data_url = f"data:image/png;base64,{png}"
    return [
        {
            "name": "chat_completions_text_and_tools",
            "description": "OpenAI Chat Completions: system, user, an assistant tool call, "
            "the tool's answer, a function tool; all text, so a ChatRequest.",
            "request": {
                "model": "gpt-4o",
                "max_tokens": 200,
                "tools": [WEATHER_TOOL],
                "messages": [
                    {"role": "system", "content": prose(600, 1)},
                    {"role": "user", "content": "What is the weather in Paris, in celsius?"},
                    {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [
                            {
                                "id": "call_1",
                                "type": "function",
                                "function": {
                                    "name": "get_weather",
                                    "arguments": '{"city": "Paris", "unit": "celsius"}',
                                },
                            }
                        ],
                    },
                    {"role": "tool", "tool_call_id": "call_1", "content": "18 degrees, sunny"},
                ],
            },
        },
        {
            "name": "chat_completions_images",
            "description": "OpenAI Chat Completions with an image_url part of a base64 PNG "
            "(1024x768, priced by its size) and one by URL at low detail (85 tokens). Not "
            "under the anthropic preset, which reads a messages request as Anthropic's: "
            "image_url is no Anthropic block.",
            "presets": ["openai", "o200k_base", "cl100k_base"],
            "request": {
                "model": "gpt-4o",
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "text", "text": "Compare these two pictures."},
                            {"type": "image_url", "image_url": {"url": data_url}},
                            {
                                "type": "image_url",
                                "image_url": {
                                    "url": "https://example.com/cat.png",
                                    "detail": "low",
                                },
                            },
                        ],
                    }
                ],
            },
        },
        {
            "name": "responses_items_and_image",
            "description": "OpenAI Responses: instructions, input_text and input_image parts "
            "(a base64 PNG and a file id, the largest image), a function call and its "
            "output, a flat function tool.",
            "request": {
                "model": "gpt-4o",
                "instructions": prose(300, 2),
                "max_output_tokens": 300,
                "input": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "input_text", "text": "What is in this picture?"},
                            {"type": "input_image", "image_url": data_url, "detail": "high"},
                            {"type": "input_image", "file_id": "file-abc123"},
                        ],
                    },
                    {
                        "type": "function_call",
                        "call_id": "c1",
                        "name": "get_weather",
                        "arguments": '{"city":"Paris"}',
                    },
                    {"type": "function_call_output", "call_id": "c1", "output": "18C, sunny"},
                ],
                "tools": [
                    {"type": "function", "strict": True, **WEATHER_TOOL["function"]},
                ],
            },
        },
        {
            "name": "responses_input_file",
            "description": "OpenAI Responses with an input_file part: neither the client nor "
            "the CLI can count a file from the request, so both refuse it by name.",
            "request": {
                "model": "gpt-4o",
                "input": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "input_text", "text": "Summarise the file."},
                            {"type": "input_file", "file_id": "file-abc123"},
                        ],
                    }
                ],
            },
            "refused": "input_file",
        },
        {
            "name": "anthropic_issue_28",
            "description": "Issue 28: an Anthropic Messages request with an 11 KB top-level "
            "system prompt, a tool_use and a 2.4 KB tool_result, and a tool definition; "
            "before the CLI read Anthropic's shape it counted 110 prompt tokens for it under the "
            "anthropic preset (the chat text and the tools alone).",
            "request": {
                "model": "claude-sonnet-4-5",
                "max_tokens": 1024,
                "system": prose(11_000, 28),
                "tools": [ANTHROPIC_TOOL],
                "messages": [
                    {"role": "user", "content": "How many orders failed yesterday?"},
                    {
                        "role": "assistant",
                        "content": [
                            {"type": "text", "text": "I will query the orders table."},
                            {
                                "type": "tool_use",
                                "id": "toolu_01",
                                "name": "run_query",
                                "input": {
                                    "sql": "SELECT id, total, status FROM orders",
                                    "limit": 500,
                                    "sample": 0.25,
                                },
                            },
                        ],
                    },
                    {
                        "role": "user",
                        "content": [
                            {
                                "type": "tool_result",
                                "tool_use_id": "toolu_01",
                                "content": table_rows(2_400),
                            }
                        ],
                    },
                ],
            },
        },
        {
            "name": "anthropic_blocks",
            "description": "Anthropic Messages: system as text blocks, a base64 image "
            "(1024x768), a text document with a title, a tool_result of blocks, a "
            "thinking block.",
            "request": {
                "model": "claude-sonnet-4-5",
                "max_tokens": 500,
                "system": [
                    {"type": "text", "text": prose(400, 3)},
                    {
                        "type": "text",
                        "text": "Answer briefly.",
                        "cache_control": {"type": "ephemeral"},
                    },
                ],
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {
                                "type": "image",
                                "source": {
                                    "type": "base64",
                                    "media_type": "image/png",
                                    "data": png,
                                },
                            },
                            {
                                "type": "document",
                                "title": "Release notes",
                                "source": {
                                    "type": "text",
                                    "media_type": "text/plain",
                                    "data": prose(800, 4),
                                },
                            },
                            {"type": "text", "text": "What changed, and what is in the picture?"},
                        ],
                    },
                    {
                        "role": "assistant",
                        "content": [
                            {"type": "thinking", "thinking": prose(200, 5), "signature": "sig"},
                            {
                                "type": "tool_use",
                                "id": "toolu_02",
                                "name": "run_query",
                                "input": {"sql": "SELECT 1"},
                            },
                        ],
                    },
                    {
                        "role": "user",
                        "content": [
                            {
                                "type": "tool_result",
                                "tool_use_id": "toolu_02",
                                "content": [{"type": "text", "text": "1"}],
                            }
                        ],
                    },
                ],
            },
        },
        {
            "name": "anthropic_by_its_blocks",
            "description": "No system: the tool_use and tool_result blocks alone make the "
            "request Anthropic's (the client's api=None).",
            "request": {
                "model": "claude-sonnet-4-5",
                "messages": [
                    {"role": "user", "content": "Run it."},
                    {
                        "role": "assistant",
                        "content": [
                            {"type": "tool_use", "id": "t", "name": "run_query", "input": {}}
                        ],
                    },
                    {
                        "role": "user",
                        "content": [{"type": "tool_result", "tool_use_id": "t", "content": "ok"}],
                    },
                ],
            },
        },
        {
            "name": "anthropic_by_api",
            "description": "Text messages and a tool: a ChatRequest unless the caller says "
            "the request is Anthropic's (api anthropic: --api anthropic, or --provider "
            "anthropic), which adds Anthropic's tool-use prompt.",
            "api": "anthropic",
            "request": {
                "model": "claude-sonnet-4-5",
                "max_tokens": 100,
                "tools": [ANTHROPIC_TOOL],
                "messages": [{"role": "user", "content": prose(500, 6)}],
            },
        },
    ]


# ---------------------------------------------------------------------------
# What the client makes of a request
# ---------------------------------------------------------------------------


def effective_api(case: dict, preset: str) -> Optional[str]:
    """The client's `api=`: the case's, else Anthropic's wrapper's under its preset."""
    if case.get("api"):
        return case["api"]
    return "anthropic" if PRESETS[preset]["provider"] == "anthropic" else None


def estimate_arguments(request: Any, api: Optional[str]) -> dict:
    """`Client.estimate`'s arguments for a request, as the client's wrappers make them."""
    if isinstance(request, list):
        return {"messages": request, "api": api}
    if "messages" in request:
        if api == "anthropic":
            cost = anthropic_core.cost(dict(request))
            return {
                "messages": cost.messages,
                "system": cost.system,
                "tools": cost.tools,
                "max_tokens": cost.max_tokens,
                "api": api,
            }
        cost = calls.CHAT.cost(dict(request))
        return {
            "messages": cost.messages,
            "system": request.get("system") or None,
            "tools": cost.tools,
            "max_tokens": cost.max_tokens,
            "api": api,
        }
    cost = calls.RESPONSES.cost(dict(request))
    return {"messages": cost.messages, "tools": cost.tools, "max_tokens": cost.max_tokens}


def load_cases() -> list[dict]:
    return json.loads(FIXTURE.read_text())["cases"]


@pytest.fixture(scope="module")
def counted(tmp_path_factory) -> Any:
    """`Client.estimate` of a daemon with one limit per preset."""
    from _daemon import Daemon

    daemon = Daemon(daemon_config()).start()
    client = Client(daemon.socket)
    yield client
    client.close()
    daemon.close()


def prompt_tokens(client: Client, case: dict, preset: str) -> int:
    arguments = estimate_arguments(case["request"], effective_api(case, preset))
    return client.estimate(preset, **arguments).input_tokens


def test_the_fixture_is_the_generated_one(counted):
    """`build_cases()` and the fixture agree (or the fixture is rewritten)."""
    cases = build_cases()
    if os.environ.get("RATEKEEPER_WRITE_REQUESTS") == "1":
        for case in cases:
            if "refused" not in case:
                case["prompt_tokens"] = {
                    preset: prompt_tokens(counted, case, preset)
                    for preset in case.get("presets", PRESETS)
                }
        document = {
            "description": "Provider requests and the prompt tokens the daemon counts for "
            "each under each preset: `ratekeeper count-tokens --provider P --model M` "
            "(tests/it/request_shapes.rs) and the Python client's Client.estimate "
            "(clients/python/tests/test_request_shapes.py) must both find them. `api` is the "
            "client's api= (count-tokens --api); under the anthropic preset a messages "
            "request is Anthropic's. Generated by test_request_shapes.py "
            "(RATEKEEPER_WRITE_REQUESTS=1).",
            "presets": PRESETS,
            "cases": cases,
        }
        FIXTURE.parent.mkdir(parents=True, exist_ok=True)
        FIXTURE.write_text(json.dumps(document, indent=2, ensure_ascii=False) + "\n")
    stored = load_cases()
    assert [dict(case, prompt_tokens=None) for case in stored] == [
        dict(case, prompt_tokens=None) for case in cases
    ]
    assert json.loads(FIXTURE.read_text())["presets"] == PRESETS


@pytest.mark.parametrize("case", load_cases(), ids=lambda case: case["name"])
def test_estimate_counts_what_the_fixture_says(counted, case):
    if "refused" in case:
        for preset in PRESETS:
            with pytest.raises(ValueError, match=case["refused"]):
                prompt_tokens(counted, case, preset)
        return
    presets = case.get("presets", list(PRESETS))
    assert sorted(case["prompt_tokens"]) == sorted(presets)
    found = {preset: prompt_tokens(counted, case, preset) for preset in presets}
    assert found == case["prompt_tokens"]


def test_the_issue_example_is_counted_whole():
    """Issue 28: the system prompt and the tool result are counted (the CLI found 25)."""
    (case,) = [case for case in load_cases() if case["name"] == "anthropic_issue_28"]
    request = case["request"]
    assert 10_900 <= len(request["system"].encode()) <= 11_100
    result = request["messages"][2]["content"][0]["content"]
    assert 2_300 <= len(result.encode()) <= 2_500
    # The character estimate (3.5 bytes a token, x1.1) of those two texts alone.
    assert case["prompt_tokens"]["anthropic"] > (11_000 + 2_400) / 3.5 * 1.1
