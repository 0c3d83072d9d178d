"""What the fake OpenAI provider serves: Chat Completions, Responses and Embeddings.

Each endpoint says what a request costs the provider's token limit (OpenAI's
rate-limit guide: the maximum of the output it may produce and about a token
per four characters of its text), the usage it answers, and the body or the
server-sent events of its answer, in the shapes the `openai` SDK parses.
"""

from __future__ import annotations

import base64
import json
import math
import struct
import time
from typing import Any

#: OpenAI's "a token is about 4 characters", the divisor of its charge estimate.
CHARS_PER_TOKEN = 4.0
#: The output charged when a request names no maximum.
DEFAULT_MAX_TOKENS = 4096
#: The dimensions of the fake's embeddings.
EMBEDDING_SIZE = 4


def _compact_json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def _part_texts(content: Any) -> str:
    """The text of a content: a string, or the `text` of each part."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            part["text"]
            for part in content
            if isinstance(part, dict) and isinstance(part.get("text"), str)
        )
    return ""


def request_characters(body: dict) -> int:
    """The characters of a chat request's text (Python `len`: Unicode code points).

    Per message: its text content (a string, or the `text` of each content
    part), its `name`, and the compact JSON of its `tool_calls`; plus the
    compact JSON of the request's `tools`.
    """
    total = 0
    for message in body.get("messages") or []:
        total += len(_part_texts(message.get("content")))
        total += len(message.get("name") or "")
        if message.get("tool_calls"):
            total += len(_compact_json(message["tool_calls"]))
    if body.get("tools"):
        total += len(_compact_json(body["tools"]))
    return total


def max_output_tokens(body: dict) -> int:
    """`max_completion_tokens`, else `max_tokens`, else OpenAI's default of 4096."""
    for key in ("max_completion_tokens", "max_tokens"):
        if body.get(key) is not None:
            return int(body[key])
    return DEFAULT_MAX_TOKENS


def rate_limit_charge(body: dict, chars_per_token: float = CHARS_PER_TOKEN) -> int:
    """What a chat request costs the token limit, by OpenAI's rate-limit guide:
    "the maximum of max_tokens and the estimated number of tokens based on the
    character count of your request", `max(max_tokens, ceil(chars / 4))`.

    This is the one definition the fake limits chat by; the daemon's `openai`
    preset is meant to compute the same figure.
    """
    estimate = math.ceil(request_characters(body) / chars_per_token)
    return max(max_output_tokens(body), estimate)


def prompt_tokens(messages: list, tools: Any = None) -> int:
    """The prompt tokens the fake reports as usage (not what it charges):
    about four characters a token, four per message, three to prime."""
    total = 3
    for message in messages:
        total += 4 + math.ceil(len(_part_texts(message.get("content") or "")) / 4)
    if tools:
        total += math.ceil(len(_compact_json(tools)) / 4)
    return total


class Chat:
    """`POST /v1/chat/completions`; streams end with a usage chunk when
    `stream_options.include_usage` is set."""

    path = "/v1/chat/completions"

    def charge(self, body: dict, chars_per_token: float) -> int:
        return rate_limit_charge(body, chars_per_token)

    def usage(self, body: dict, completion_tokens: int, cached_tokens: int = 0) -> dict:
        prompt = prompt_tokens(body.get("messages") or [], body.get("tools"))
        completion = min(completion_tokens, max_output_tokens(body))
        usage = {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        }
        if cached_tokens:  # as OpenAI: the cached tokens are part of prompt_tokens
            usage["prompt_tokens_details"] = {"cached_tokens": min(cached_tokens, prompt)}
        return usage

    def reply(self, body: dict, usage: dict) -> dict:
        return {
            "id": "chatcmpl-fake",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model", "fake"),
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "fake reply"},
                    "finish_reason": "stop",
                }
            ],
            "usage": usage,
        }

    def events(self, body: dict, usage: dict) -> list[str]:
        """The SSE frames of a stream."""
        include_usage = (body.get("stream_options") or {}).get("include_usage")

        def chunk(choices: list, with_usage: Any = None) -> str:
            data = {
                "id": "chatcmpl-fake",
                "object": "chat.completion.chunk",
                "created": int(time.time()),
                "model": body.get("model", "fake"),
                "choices": choices,
            }
            if include_usage:
                data["usage"] = with_usage
            return f"data: {json.dumps(data)}\n\n"

        frames = []
        for index, piece in enumerate(["fake", " streamed", " reply"]):
            delta = {"content": piece}
            if index == 0:
                delta["role"] = "assistant"
            frames.append(chunk([{"index": 0, "delta": delta, "finish_reason": None}]))
        frames.append(chunk([{"index": 0, "delta": {}, "finish_reason": "stop"}]))
        if include_usage:
            frames.append(chunk([], usage))
        frames.append("data: [DONE]\n\n")
        return frames


def responses_messages(body: dict) -> list[dict]:
    """A Responses request's text as the messages the fake counts: `instructions`,
    then each input item's text (a message's content, a function call's name
    and arguments, a function call's output)."""
    messages = []
    if body.get("instructions"):
        messages.append({"content": body["instructions"]})
    given = body.get("input")
    if isinstance(given, str):
        return [*messages, {"content": given}]
    for item in given or []:
        kind = item.get("type") or "message"
        if kind == "message":
            text = _part_texts(item.get("content"))
        elif kind == "function_call":
            text = (item.get("name") or "") + (item.get("arguments") or "")
        else:
            text = _part_texts(item.get("output"))
        messages.append({"content": text})
    return messages


class Responses:
    """`POST /v1/responses`; streams are the documented typed events, the usage
    on the final `response.completed`."""

    path = "/v1/responses"
    text = ("fake", " streamed", " reply")

    def charge(self, body: dict, chars_per_token: float) -> int:
        chars = sum(len(message["content"]) for message in responses_messages(body))
        if body.get("tools"):
            chars += len(_compact_json(body["tools"]))
        return max(self._max_output(body), math.ceil(chars / chars_per_token))

    def _max_output(self, body: dict) -> int:
        given = body.get("max_output_tokens")
        return DEFAULT_MAX_TOKENS if given is None else int(given)

    def usage(self, body: dict, completion_tokens: int, cached_tokens: int = 0) -> dict:
        prompt = prompt_tokens(responses_messages(body), body.get("tools"))
        output = min(completion_tokens, self._max_output(body))
        return {
            "input_tokens": prompt,
            "input_tokens_details": {"cached_tokens": min(cached_tokens, prompt)},
            "output_tokens": output,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt + output,
        }

    def _message(self, text: str, status: str) -> dict:
        content = [{"type": "output_text", "text": text, "annotations": []}]
        return {
            "id": "msg-fake",
            "type": "message",
            "role": "assistant",
            "status": status,
            "content": content if text or status == "completed" else [],
        }

    def _response(self, body: dict, status: str, output: list, usage: Any) -> dict:
        return {
            "id": "resp-fake",
            "object": "response",
            "created_at": int(time.time()),
            "model": body.get("model", "fake"),
            "status": status,
            "output": output,
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": body.get("tools") or [],
            "usage": usage,
        }

    def reply(self, body: dict, usage: dict) -> dict:
        message = self._message("fake reply", "completed")
        return self._response(body, "completed", [message], usage)

    def events(self, body: dict, usage: dict) -> list[str]:
        text = "".join(self.text)
        part = {"type": "output_text", "text": "", "annotations": []}
        where = {"item_id": "msg-fake", "output_index": 0}
        events: list[dict] = [
            {"type": "response.created", "response": self._response(body, "in_progress", [], None)},
            {
                "type": "response.output_item.added",
                "output_index": 0,
                "item": self._message("", "in_progress"),
            },
            {"type": "response.content_part.added", **where, "content_index": 0, "part": part},
        ]
        for piece in self.text:
            events.append(
                {
                    "type": "response.output_text.delta",
                    **where,
                    "content_index": 0,
                    "delta": piece,
                    "logprobs": [],
                }
            )
        done_part = {**part, "text": text}
        message = self._message(text, "completed")
        events += [
            {
                "type": "response.output_text.done",
                **where,
                "content_index": 0,
                "text": text,
                "logprobs": [],
            },
            {"type": "response.content_part.done", **where, "content_index": 0, "part": done_part},
            {"type": "response.output_item.done", "output_index": 0, "item": message},
            {
                "type": "response.completed",
                "response": self._response(body, "completed", [message], usage),
            },
        ]
        return [
            f"event: {event['type']}\ndata: {json.dumps({**event, 'sequence_number': number})}\n\n"
            for number, event in enumerate(events)
        ]


class Embeddings:
    """`POST /v1/embeddings`: texts cost a token per four characters, token ids
    one each; nothing is output. The vectors are base64 floats unless
    `encoding_format` is "float", as the SDK asks by default."""

    path = "/v1/embeddings"

    def _inputs(self, body: dict) -> list:
        given = body.get("input")
        if isinstance(given, str) or (given and isinstance(given[0], int)):
            return [given]
        return list(given or [])

    def _tokens(self, body: dict, chars_per_token: float) -> int:
        return sum(
            math.ceil(len(item) / chars_per_token) if isinstance(item, str) else len(item)
            for item in self._inputs(body)
        )

    def charge(self, body: dict, chars_per_token: float) -> int:
        return self._tokens(body, chars_per_token)

    def usage(self, body: dict, completion_tokens: int, cached_tokens: int = 0) -> dict:
        prompt = self._tokens(body, CHARS_PER_TOKEN)
        return {"prompt_tokens": prompt, "total_tokens": prompt}

    def reply(self, body: dict, usage: dict) -> dict:
        vector = [0.5] * EMBEDDING_SIZE
        if body.get("encoding_format") == "base64":
            packed = struct.pack(f"<{EMBEDDING_SIZE}f", *vector)
            vector = base64.b64encode(packed).decode()
        data = [
            {"object": "embedding", "index": index, "embedding": vector}
            for index in range(len(self._inputs(body)))
        ]
        return {"object": "list", "data": data, "model": body.get("model", "fake"), "usage": usage}


ENDPOINTS = {endpoint.path: endpoint for endpoint in (Chat(), Responses(), Embeddings())}
