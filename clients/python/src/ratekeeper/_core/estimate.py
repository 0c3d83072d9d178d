"""The client-side prompt estimate, about four characters a token.

Transitional: the OpenAI wrapper falls back on it while a daemon from before
token counting answers `Unsupported` to a messages cost; it goes once such
daemons are gone. It is no tokenizer.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from .requests import MessageLike, _json_text, chat_message

#: Output tokens reserved by the client-side estimate when nothing says more.
FALLBACK_MAX_TOKENS = 1024


def estimate_prompt_tokens(messages: Iterable[MessageLike], tools: Any = None) -> int:
    """A rough client-side count of a chat request's prompt: about 4 characters a token.

    Used by the OpenAI wrapper when a daemon from before token counting answers
    `Unsupported` to message costs; it is no tokenizer.
    """
    total = 3  # every reply is primed with a few tokens
    for message in messages:
        chat = chat_message(message)
        text = sum(len(part) for part in chat.content)
        text += len(chat.name or "") + len(chat.tool_calls_json or "")
        total += 4 + math.ceil(text / 4)
    tools_json = _json_text(tools) if tools else None
    if tools_json:
        total += math.ceil(len(tools_json) / 4)
    return total
