"""The OpenAI calls the wrapper limits, sans I/O: what each costs and what it used.

Chat Completions, Responses and Embeddings ask and answer in shapes of their
own. Each request becomes one `Cost` to acquire: chat-shaped `messages` for
the daemon to count with the limit's tokenizer, or a number of tokens known
here exactly (embeddings given as token ids). A Responses request becomes
messages the way the daemon's own `ratekeeper count-tokens` reads one
(`src/tokens/request_json.rs`): `instructions` a system message, then one
message per input item, function tools nested as chat tools. Each answer's
usage is read back as `Counts` (input, output, and the cached input apart:
`prompt_tokens_details.cached_tokens`, or the Responses API's
`input_tokens_details.cached_tokens`), from a reply, a stream's events or
a body the caller read. Which parts of the OpenAI client spend tokens
unlimited, and warn once, are here too.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from typing import Any, Optional

from .calls import Cost, Counts

log = logging.getLogger("ratekeeper.openai")


#: Parts of the OpenAI client that spend tokens but pass through the wrapper
#: unlimited: reaching one warns (once per wrapped client and name). The
#: client-wide `with_raw_response` / `with_streaming_response` reach every
#: resource unlimited; the wrapped resources have their own.
UNLIMITED_SPENDERS = frozenset(
    {
        "completions",
        "images",
        "audio",
        "beta",
        "batches",
        "realtime",
        "with_raw_response",
        "with_streaming_response",
    }
)


#: The same for `chat`: its own raw and streaming views reach `completions` unlimited.
UNLIMITED_CHAT_PARTS = frozenset({"with_raw_response", "with_streaming_response"})


class RawStreamResponse:
    """A stream's raw answer (`with_raw_response.create(stream=True)`) whose
    `parse()` gives the wrapper's stream, which settles at its end, instead of
    the SDK's; everything else (`headers`, `http_response`, ...) is the SDK's."""

    def __init__(self, response: Any, stream: Any) -> None:
        self._response = response
        self._stream = stream

    def parse(self, *, to: Any = None) -> Any:
        if to is None:
            return self._stream
        return self._response.parse(to=to)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._response, name)


def _get(value: Any, name: str) -> Any:
    """`value[name]` of a dict, `value.name` of an SDK object; None if absent."""
    if isinstance(value, Mapping):
        return value.get(name)
    return getattr(value, name, None)


def _mapping(value: Any) -> Any:
    """SDK objects (pydantic models) as dicts; anything else as it is."""
    dump = getattr(value, "model_dump", None)
    if callable(dump) and not isinstance(value, Mapping):
        return dump(exclude_none=True)
    return value


def _tokens(value: Any) -> Optional[int]:
    """A token count an SDK call was given: an int; None for the SDK's `omit`,
    `NOT_GIVEN` and anything else that is no count."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _listed(kwargs: dict, name: str) -> Any:
    """`kwargs[name]`, made a list if it was another iterable (a generator would
    be used up by counting it before the SDK sends it)."""
    value = kwargs.get(name)
    if isinstance(value, (str, bytes, list, Mapping)) or not isinstance(value, Iterable):
        return value
    kwargs[name] = value = list(value)
    return value


class Api:
    """One endpoint the wrapper limits: its cost, and where its answers carry usage."""

    #: Where the endpoint is in the SDK client, for messages.
    path = ""
    #: The usage fields read as (input, output); output None: the answer has none.
    usage_fields: tuple[str, Optional[str]] = ("prompt_tokens", "completion_tokens")
    #: Where the usage says how many of its input tokens were cache reads
    #: (included in the input field); None: it never does.
    cached_field: Optional[str] = "prompt_tokens_details"
    #: The SDK methods of the endpoint that are limited (also under
    #: `with_raw_response` and `with_streaming_response`).
    methods: frozenset = frozenset({"create"})
    #: The endpoint's other SDK methods that spend tokens unlimited: they warn.
    unlimited: frozenset = frozenset()

    def cost(self, kwargs: dict) -> Cost:
        raise NotImplementedError

    def prepare(self, kwargs: dict) -> bool:
        """Adjusts a request so that its stream reports usage; True when the caller
        did not ask for the chunk that carries it (it is then hidden)."""
        return False

    def counts(self, usage: Any) -> Optional[Counts]:
        """What an answer's `usage` (a dict or an SDK object) says was used.

        OpenAI's input count includes the tokens read from the prompt cache
        (`cached_tokens` of its details; none when the details are missing):
        they are reported apart, and the input as the rest, billed at the
        full price. OpenAI bills no cache writes.
        """
        if usage is None:
            return None
        input_name, output_name = self.usage_fields
        output = None if output_name is None else _tokens(_get(usage, output_name))
        used = _tokens(_get(usage, input_name)), output
        if used == (None, None):
            return None
        input_tokens = used[0] or 0
        cached = 0
        if self.cached_field is not None:
            details = _get(usage, self.cached_field)
            cached = min(_tokens(_get(details, "cached_tokens")) or 0, input_tokens)
        return Counts(input_tokens - cached, used[1] or 0, cached_input_tokens=cached)

    def reply_counts(self, reply: Any) -> Optional[Counts]:
        """(input, output) of a whole answer (the SDK's object, or its JSON body)."""
        return self.counts(_get(reply, "usage"))

    def event_usage(self, event: Any) -> Any:
        """The usage a stream's event (or chunk) carries, else None."""
        return None

    def usage_only(self, event: Any) -> bool:
        """Whether an event is the usage chunk `prepare` asked for (hidden from
        callers who did not ask for it)."""
        return False

    def body_counts(self, body: Any) -> Optional[Counts]:
        """(input, output) of an answer's body as read by the caller: JSON (bytes
        or text), or server-sent events whose usage is in the events."""
        if isinstance(body, bytes):
            body = body.decode("utf-8", "replace")
        if not isinstance(body, str):
            return self.reply_counts(body)
        try:
            return self.reply_counts(json.loads(body))
        except ValueError:
            pass
        usage = None
        for line in body.splitlines():
            if not line.startswith("data:"):
                continue
            try:
                event = json.loads(line[5:])
            except ValueError:
                continue  # [DONE], or a line cut short
            usage = self.event_usage(event) or usage
        return self.counts(usage)


class ChatCompletions(Api):
    """`chat.completions`: the messages, tools and `max_completion_tokens` /
    `max_tokens`; usage `prompt_tokens` / `completion_tokens`, in streams on a
    last chunk the wrapper asks for (`stream_options.include_usage`)."""

    path = "chat.completions"
    methods = frozenset({"create", "parse"})

    def cost(self, kwargs: dict) -> Cost:
        messages = _listed(kwargs, "messages") or []
        tools = _listed(kwargs, "tools") or _listed(kwargs, "functions") or None
        max_tokens = _tokens(kwargs.get("max_completion_tokens"))
        if max_tokens is None:
            max_tokens = _tokens(kwargs.get("max_tokens"))
        return Cost(list(messages), tools, max_tokens)

    def prepare(self, kwargs: dict) -> bool:
        if kwargs.get("stream") is not True:
            return False
        return ask_for_usage(kwargs)

    def event_usage(self, event: Any) -> Any:
        return _get(event, "usage")

    def usage_only(self, event: Any) -> bool:
        return _get(event, "usage") is not None and not _get(event, "choices")


def ask_for_usage(kwargs: dict) -> bool:
    """Asks a chat stream for its usage chunk; True when the caller did not."""
    stream_options = dict(kwargs.get("stream_options") or {})
    injected = "include_usage" not in stream_options
    stream_options.setdefault("include_usage", True)
    kwargs["stream_options"] = stream_options
    return injected


#: The events that end a Responses stream; each carries the whole response, usage included.
_FINAL_EVENTS = frozenset({"response.completed", "response.incomplete", "response.failed"})


class Responses(Api):
    """`responses`: `instructions`, `input` and `tools` as chat messages, as the
    daemon reads them, and `max_output_tokens`; usage `input_tokens` /
    `output_tokens`, in streams on the final event (`response.completed`, or
    `response.incomplete` / `response.failed`)."""

    path = "responses"
    usage_fields = ("input_tokens", "output_tokens")
    cached_field = "input_tokens_details"
    methods = frozenset({"create", "parse"})
    #: `compact` runs the model over a conversation; `connect` opens a WebSocket.
    unlimited = frozenset({"compact", "connect"})

    def cost(self, kwargs: dict) -> Cost:
        return Cost(
            responses_messages(kwargs),
            responses_tools(_listed(kwargs, "tools")),
            _tokens(kwargs.get("max_output_tokens")),
        )

    def event_usage(self, event: Any) -> Any:
        if _get(event, "type") not in _FINAL_EVENTS:
            return None
        return _get(_get(event, "response"), "usage")


def responses_messages(kwargs: dict) -> list:
    """A Responses request's `instructions` and `input` as chat messages:
    `instructions` a system message, a string input one user message, and
    one message per input item (see `_input_item`). Refuses, with a
    `ValueError` naming its place, what it cannot count."""
    messages = []
    instructions = kwargs.get("instructions")
    if isinstance(instructions, str):
        messages.append({"role": "system", "content": instructions})
    elif instructions:
        raise ValueError(f"instructions must be a string, not {instructions!r}")
    given = _listed(kwargs, "input")
    if isinstance(given, str):
        messages.append({"role": "user", "content": given})
    elif isinstance(given, list):
        messages += [_input_item(item, f"input[{index}]") for index, item in enumerate(given)]
    elif given:
        raise ValueError(f"input must be a string or a list of items, not {given!r}")
    return messages


def _input_item(item: Any, where: str) -> dict:
    """One Responses input item as a chat message: a message (`type` "message"
    or none), a function call (an assistant tool call) or a function call's
    output (a tool message). Reasoning, built-in tool calls, item references
    and the rest are refused rather than counted as nothing."""
    item = _mapping(item)
    if not isinstance(item, Mapping):
        raise ValueError(f"{where}: an input item must be an object, not {item!r}")
    kind = item.get("type") or "message"
    if kind == "message":
        content = _input_content(item.get("content"), f"{where}.content")
        return {"role": item.get("role") or "user", "content": content}
    if kind == "function_call":
        # The daemon writes the call as JSON with its keys sorted.
        call = {"arguments": item.get("arguments"), "name": item.get("name")}
        return {"role": "assistant", "tool_calls": [call]}
    if kind == "function_call_output":
        return {"role": "tool", "content": _input_content(item.get("output"), f"{where}.output")}
    raise ValueError(
        f"{where}: Responses input items of type {kind!r} are not counted by ratekeeper "
        "(only messages, function_call and function_call_output are); leave them out "
        "(previous_response_id keeps them on the server), or acquire with tokens= yourself"
    )


def _input_content(content: Any, where: str) -> Any:
    """A Responses content as a chat content: text parts (`input_text`,
    `output_text`, `refusal`) as text, `input_image` as an image (priced from
    its size when it is a data URL, else as the largest image); others refused."""
    if content is None or isinstance(content, str):
        return content
    parts = []
    for index, part in enumerate(content):
        part = _mapping(part)
        kind = _get(part, "type")
        if kind in ("input_text", "output_text", "text"):
            parts.append({"type": "text", "text": _get(part, "text") or ""})
        elif kind == "refusal":
            parts.append({"type": "text", "text": _get(part, "refusal") or ""})
        elif kind == "input_image":
            image = {"url": _get(part, "image_url") or "", "detail": _get(part, "detail") or ""}
            parts.append({"type": "image_url", "image_url": image})
        else:
            raise ValueError(
                f"{where}[{index}]: content parts of type {kind!r} are not counted by "
                "ratekeeper (only input_text, output_text, refusal and input_image are); "
                "acquire with tokens= yourself"
            )
    return parts


def responses_tools(tools: Any) -> Optional[list]:
    """Responses tools as chat tools: a function tool's fields (less `type` and
    `strict`) nested under `function`, as the daemon's tool counter reads them;
    other tools as they are. None for no tools."""
    if not tools:
        return None
    nested = []
    for tool in tools:
        tool = _mapping(tool)
        if _get(tool, "type") == "function" and "function" not in tool:
            function = {k: v for k, v in tool.items() if k not in ("type", "strict")}
            tool = {"type": "function", "function": function}
        nested.append(tool)
    return nested


class Embeddings(Api):
    """`embeddings`: the input texts, or token ids counted here; no output; usage
    `prompt_tokens`."""

    path = "embeddings"
    usage_fields = ("prompt_tokens", None)
    cached_field = None

    def cost(self, kwargs: dict) -> Cost:
        """Texts are sent as the parts of one user message: the daemon counts each
        part on its own with the limit's tokenizer, as the endpoint counts each
        input, so the reservation is their sum plus one message's framing (about
        seven tokens, given back at the report), and workers need no tokenizer.
        Token ids are counted exactly here. Nothing is reserved for output."""
        given = _listed(kwargs, "input")
        if isinstance(given, str):
            given = [given]
        if not isinstance(given, list):
            raise ValueError(f"input must be a string or a list, not {given!r}")
        if all(isinstance(text, str) for text in given):
            parts = [{"type": "text", "text": text} for text in given]
            return Cost([{"role": "user", "content": parts}], max_tokens=0)
        if all(_is_token(token) for token in given):
            return Cost(tokens=len(given), max_tokens=0)
        arrays = [list(array) for array in given if isinstance(array, Iterable)]
        if len(arrays) == len(given) and all(_is_token(t) for array in arrays for t in array):
            return Cost(tokens=sum(len(array) for array in arrays), max_tokens=0)
        raise ValueError(
            "input must be a string, a list of strings, a list of token ids "
            "or a list of lists of token ids"
        )


def _is_token(value: Any) -> bool:
    """A token id: an int or an int-like (numpy's), not a bool, a string or an array."""
    if isinstance(value, (bool, Iterable)):
        return False
    return hasattr(type(value), "__index__")


CHAT = ChatCompletions()
RESPONSES = Responses()
EMBEDDINGS = Embeddings()


def snapshot_counts(api: Api, stream: Any) -> Optional[Counts]:
    """(input, output) of a `chat.completions.stream()` stream from its snapshot,
    whose usage is the last chunk's: known once the stream reached its end."""
    try:
        snapshot = stream.current_completion_snapshot  # asserts that one exists
    except (AssertionError, AttributeError):
        return None
    return api.counts(_get(snapshot, "usage"))
