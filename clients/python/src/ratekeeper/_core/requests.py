"""The requests the public API's arguments make, sans I/O: `max_wait` in
milliseconds, chat messages of any shape as the wire's, costs, and the
acquire a client sends (encoded without building a dataclass per call).
"""

from __future__ import annotations

import math
import operator
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Optional, Union

from .. import _proto as p
from .._proto.errors import ErrorCode
from .._proto.token_acquire import encode_token_acquire
from . import content
from .content import as_mapping, compact_json

if TYPE_CHECKING:
    from .deadlines import Deadline

MessageLike = Union[Mapping[str, Any], p.ChatMessage, Any]

#: A cost the daemon counts: chat messages, or content blocks (revision 4).
MessageCost = Union[p.ChatRequest, p.Conversation]

#: What `api=` accepts: whose request shape the messages, `system` and `tools` are.
Api = Literal["anthropic", "openai"]
APIS = (content.ANTHROPIC, content.OPENAI)


@dataclass(frozen=True)
class Reservation:
    """What a lease reserved, per side, so it can be settled as fully used."""

    input_tokens: int
    output_tokens: int


def token_count(name: str, value: Any) -> int:
    """A whole, non-negative number of tokens. A float or a bool is refused
    rather than truncated: 1200.7 tokens is a bug in the caller's arithmetic."""
    if type(value) is not int:
        if isinstance(value, bool) or not hasattr(type(value), "__index__"):
            raise TypeError(
                f"{name} must be an int (a whole number of tokens), "
                f"got {type(value).__name__} {value!r}"
            )
        value = operator.index(value)  # an int-like such as numpy.int64
    if value < 0:
        raise ValueError(f"{name} must not be negative, got {value}")
    return value


def wait_ms(seconds: Optional[float]) -> Optional[int]:
    """`max_wait` in seconds as the wire's milliseconds (None stays None)."""
    if seconds is None:
        return None
    if seconds < 0 or math.isnan(seconds):
        raise ValueError(f"max_wait must be a non-negative number of seconds, got {seconds}")
    return round(seconds * 1000)


def _text_parts(content: Any) -> tuple[str, ...]:
    """The text parts of a message's content: a string is one part, None none.

    Non-text parts (images, audio, files) are left out: they are not text to count.
    """
    if content is None:
        return ()
    if isinstance(content, str):
        return (content,)
    parts = []
    for part in content:
        part = as_mapping(part)
        if isinstance(part, str):
            parts.append(part)
        elif isinstance(part.get("text"), str):
            parts.append(part["text"])
        elif isinstance(part.get("refusal"), str):
            parts.append(part["refusal"])
    return tuple(parts)


def _json_text(value: Any) -> Optional[str]:
    return None if value is None else compact_json(value)


def chat_message(message: MessageLike) -> p.ChatMessage:
    """One OpenAI-style chat message as the protocol's `ChatMessage`."""
    if isinstance(message, p.ChatMessage):
        return message
    message = as_mapping(message)
    tool_calls = message.get("tool_calls")
    if tool_calls is None and message.get("function_call") is not None:
        tool_calls = [message["function_call"]]
    return p.ChatMessage(
        role=str(message.get("role", "user")),
        content=_text_parts(message.get("content")),
        name=message.get("name"),
        tool_calls_json=_json_text(tool_calls),
    )


def chat_request(
    messages: Iterable[MessageLike], max_tokens: Optional[int], tools: Any = None
) -> p.ChatRequest:
    """The `Cost::Messages` of a chat request."""
    return p.ChatRequest(
        messages=tuple(chat_message(m) for m in messages),
        tools_json=_json_text(tools) if tools else None,
        max_output_tokens=max_tokens,
    )


def message_cost(
    messages: Iterable[MessageLike],
    max_tokens: Optional[int],
    tools: Any = None,
    system: Any = None,
    api: Optional[str] = None,
) -> MessageCost:
    """The cost of a request by its messages: a `ChatRequest` for OpenAI-style text
    messages (what every daemon counts), a `Conversation` for Anthropic's shape
    (`api="anthropic"`, a `system`, or Anthropic blocks) or OpenAI images."""
    if api is not None and api not in APIS:
        raise ValueError(f"api must be one of {APIS} or None, got {api!r}")
    messages = list(messages)
    shape = api or content.shape_of(messages, system)
    if shape == content.ANTHROPIC:
        return content.anthropic_conversation(messages, system, tools, max_tokens)
    if system is not None:
        raise ValueError("system= is Anthropic's: OpenAI messages carry a system message")
    chat = chat_request(messages, max_tokens, tools)
    if content.shape_of(messages, None) == content.OPENAI:
        return content.openai_conversation(chat, messages, max_tokens)
    return chat


def unsupported(response: p.Response) -> bool:
    """Whether `response` refuses a request of a later revision than the daemon's
    (`Unsupported`, or `MalformedMessage` from 0.1 daemons: PROTOCOL.md §10)."""
    return isinstance(response, p.ErrorReply) and response.code in (
        ErrorCode.MALFORMED_MESSAGE,
        ErrorCode.UNSUPPORTED,
    )


def predating(response: p.Response, revision: int, what: str) -> p.Response:
    """`Unsupported` saying so for a daemon older than protocol `revision` refusing
    a request of that revision (`unsupported`); any other answer as it is."""
    if isinstance(response, p.ErrorReply) and unsupported(response):
        return p.ErrorReply(
            ErrorCode.UNSUPPORTED,
            f"the sidecar predates protocol revision {revision} and cannot {what}; "
            f"upgrade it ({response.message})",
        )
    return response


def older_daemon(response: p.Response, cost: Any) -> p.Response:
    """`Unsupported` for a daemon of revision 3 or earlier refusing a `Conversation`
    (it answers `MalformedMessage`, PROTOCOL.md §10); any other answer as it is."""
    if type(cost) is not p.Conversation:
        return response
    return predating(response, 4, "count content blocks (Anthropic's shape, images)")


def _token_counts(
    tokens: Optional[int], messages: Optional[Iterable[MessageLike]], max_tokens: Optional[int]
) -> Optional[tuple[int, int]]:
    """The checked (input, output) counts of a token cost; None for messages."""
    if (tokens is None) == (messages is None):
        raise ValueError("give exactly one of tokens= or messages=")
    output = 0 if max_tokens is None else token_count("max_tokens", max_tokens)
    if messages is not None:
        return None
    return token_count("tokens", tokens), output


def build_cost(
    tokens: Optional[int],
    messages: Optional[Iterable[MessageLike]],
    max_tokens: Optional[int],
    tools: Any = None,
    system: Any = None,
    api: Optional[str] = None,
) -> p.Cost:
    """`tokens` (prompt tokens) + `max_tokens` (output to reserve), or messages to count."""
    counts = _token_counts(tokens, messages, max_tokens)
    if counts is None:
        return message_cost(messages, max_tokens, tools, system, api)  # type: ignore[arg-type]
    if system is not None:
        raise ValueError("system= is counted with messages=, not with tokens=")
    return p.TokenCost(*counts)


class AcquireRequest:
    """An acquire as the policy holds it across attempts: its checked arguments.

    Not a message: a token cost (the common case) is packed straight from
    these fields by `encode_token_acquire` (`_proto/token_acquire.py`), with
    no dataclass built on the way; a message cost keeps its `p.ChatRequest`
    and goes through `p.Acquire`.
    """

    __slots__ = (
        "_body",
        "chat",
        "input_tokens",
        "limit",
        "max_wait_ms",
        "output_tokens",
        "priority",
        "tenant",
    )

    def __init__(
        self,
        limit: str,
        input_tokens: int,
        output_tokens: int,
        chat: Optional[MessageCost],
        tenant: Optional[str],
        priority: Optional[str],
        max_wait_ms: Optional[int],
    ) -> None:
        self.limit = limit
        self.input_tokens = input_tokens
        self.output_tokens = output_tokens
        #: The messages to count, or None for a token cost.
        self.chat = chat
        self.tenant = tenant
        self.priority = priority
        self.max_wait_ms = max_wait_ms
        #: A token cost's frame after its request id, once encoded: the same
        #: for every attempt and, through `build_acquire`'s cache, every call.
        self._body: Optional[bytes] = None

    @property
    def cost(self) -> p.Cost:
        if self.chat is not None:
            return self.chat
        return p.TokenCost(self.input_tokens, self.output_tokens)

    def message(self) -> p.Acquire:
        """The `Acquire` message this stands for."""
        return p.Acquire(self.limit, self.cost, self.tenant, self.priority, self.max_wait_ms)

    def frame(self, request_id: int, max_frame_len: int) -> bytes:
        """The encoded `ClientFrame` of this acquire under `request_id`."""
        if self.chat is None:
            body = self._body
            if body is not None and len(body) + 8 <= max_frame_len:
                return p.FRAME_HEAD.pack(len(body) + 8, request_id) + body
            frame = encode_token_acquire(
                request_id,
                self.limit,
                self.tenant,
                self.priority,
                self.input_tokens,
                self.output_tokens,
                self.max_wait_ms,
                max_frame_len,
            )  # raises what the arguments or the daemon's bound refuse
            self._body = frame[p.FRAME_HEAD.size :]
            return frame
        return p.encode_frame(p.ClientFrame(request_id, self.message()), max_frame_len)

    def with_max_wait_ms(self, max_wait_ms: Optional[int]) -> AcquireRequest:
        return AcquireRequest(
            self.limit,
            self.input_tokens,
            self.output_tokens,
            self.chat,
            self.tenant,
            self.priority,
            max_wait_ms,
        )

    def reservation(self, granted_tokens: int) -> Reservation:
        """Splits a grant into input and output tokens (the daemon returns the sum)."""
        if self.chat is None:
            return Reservation(self.input_tokens, self.output_tokens)
        output = min(self.chat.max_output_tokens or 0, granted_tokens)
        return Reservation(granted_tokens - output, output)

    def __repr__(self) -> str:
        return f"<AcquireRequest {self.message()!r}>"


#: `build_acquire`'s token-cost acquires by their arguments (limit, tokens,
#: tenant, priority, max_wait), at most this many.
_TOKEN_ACQUIRES_KEPT = 1024
_token_acquires: dict[tuple[Any, ...], AcquireRequest] = {}


def build_acquire(
    limit: str,
    tokens: Optional[int],
    messages: Optional[Iterable[MessageLike]],
    max_tokens: Optional[int],
    tools: Any,
    tenant: Optional[str],
    priority: Optional[str],
    max_wait: Optional[float],
    system: Any = None,
    api: Optional[str] = None,
) -> AcquireRequest:
    """The acquire of the public API's arguments, checked before anything is sent."""
    if type(tokens) is int and tokens > 0 and messages is None and max_tokens is None:
        if system is not None:
            raise ValueError("system= is counted with messages=, not with tokens=")
        # The usual acquire: the same few arguments call after call. Made and
        # checked once, it keeps its encoded frame (`AcquireRequest.frame`).
        key = (limit, tokens, tenant, priority, max_wait)
        try:
            request = _token_acquires.get(key)
        except TypeError:  # an unhashable name: refused by the encoder below
            key, request = None, None
        if request is None:
            request = AcquireRequest(limit, tokens, 0, None, tenant, priority, wait_ms(max_wait))
            if key is not None:
                if len(_token_acquires) >= _TOKEN_ACQUIRES_KEPT:
                    _token_acquires.clear()
                _token_acquires[key] = request
        return request
    max_wait_ms = None if max_wait is None else wait_ms(max_wait)
    counts = _token_counts(tokens, messages, max_tokens)
    if counts is None:
        cost = message_cost(messages, max_tokens, tools, system, api)  # type: ignore[arg-type]
        return AcquireRequest(limit, 0, 0, cost, tenant, priority, max_wait_ms)
    if system is not None:
        raise ValueError("system= is counted with messages=, not with tokens=")
    return AcquireRequest(limit, counts[0], counts[1], None, tenant, priority, max_wait_ms)


class Settlement:
    """A lease's `Report`, `UsageReport` or `Release` as the policy sends it:
    its integers.

    Not a message: a `Report` or `Release` is packed by the precompiled layout
    of its message type (`p.FIXED_REQUESTS`) with no dataclass built on the
    way; `message()` is the message it stands for, byte for byte. A report
    with cache figures is a `UsageReport` (revision 6), whose `input_tokens`
    is the full-price input only; `as_report()` is the `Report` to send
    instead to a daemon that predates it.
    """

    __slots__ = (
        "cache_write_tokens",
        "cached_input_tokens",
        "input_tokens",
        "lease",
        "output_tokens",
        "release",
    )

    def __init__(
        self,
        lease: int,
        input_tokens: int,
        output_tokens: int,
        release: bool,
        cached_input_tokens: int = 0,
        cache_write_tokens: int = 0,
    ) -> None:
        self.lease = lease
        self.input_tokens = input_tokens
        self.output_tokens = output_tokens
        #: A `Release` (give everything back) rather than a report of the counts.
        self.release = release
        self.cached_input_tokens = cached_input_tokens
        self.cache_write_tokens = cache_write_tokens

    @property
    def usage_report(self) -> bool:
        """Whether this is a `UsageReport`: a report with cache figures."""
        return not self.release and bool(self.cached_input_tokens or self.cache_write_tokens)

    def as_report(self) -> Settlement:
        """The `Report` of this settlement for a daemon without `UsageReport`:
        every input token as input (cache reads and writes included), which
        errs high where the provider does not count cache reads, never low."""
        if not self.usage_report:
            return self
        input_tokens = self.input_tokens + self.cached_input_tokens + self.cache_write_tokens
        return Settlement(self.lease, input_tokens, self.output_tokens, False)

    def message(self) -> Union[p.Report, p.UsageReport, p.Release]:
        if self.release:
            return p.Release(self.lease)
        if self.usage_report:
            usage = p.Usage(
                self.input_tokens,
                self.cached_input_tokens,
                self.cache_write_tokens,
                self.output_tokens,
            )
            return p.UsageReport(self.lease, usage)
        return p.Report(self.lease, self.input_tokens, self.output_tokens)

    def frame(self, request_id: int, max_frame_len: int) -> bytes:
        """The encoded `ClientFrame` of the settlement under `request_id`."""
        if self.usage_report:
            return p.encode_request(request_id, self.message(), max_frame_len)
        try:
            if self.release:
                return _RELEASE.pack(_RELEASE.size - 4, request_id, _RELEASE_TAG, self.lease)
            return _REPORT.pack(
                _REPORT.size - 4,
                request_id,
                _REPORT_TAG,
                self.lease,
                self.input_tokens,
                self.output_tokens,
            )
        except struct.error:  # out of range: the codec says which
            return p.encode_request(request_id, self.message(), max_frame_len)

    def __repr__(self) -> str:
        return f"<Settlement {self.message()!r}>"


def _settlement_layout(cls: type, names: tuple[str, ...]) -> tuple[struct.Struct, int]:
    """The precompiled layout and tag of `cls`, checked against what `Settlement` packs."""
    layout, tag, declared = p.FIXED_REQUESTS[cls]
    if declared != names or layout.format != "<IQI" + "Q" * len(names):
        raise RuntimeError(
            f"Settlement packs {cls.__name__}{names}, the messages declare {declared}"
        )
    return layout, tag


_REPORT, _REPORT_TAG = _settlement_layout(p.Report, ("lease", "input_tokens", "output_tokens"))
_RELEASE, _RELEASE_TAG = _settlement_layout(p.Release, ("lease",))

#: What a connection sends: a message, or an acquire or settlement kept as its integers.
AnyRequest = Union[p.Request, AcquireRequest, Settlement]

#: The requests that encode themselves (`frame`), without a message.
PACKED = (AcquireRequest, Settlement)


def with_remaining_wait(
    request: AcquireRequest, overall: Deadline, timeout: float
) -> AcquireRequest:
    """The acquire to resend after a reconnect: its wait shortened by the time spent.

    `overall` is the acquire's deadline: its wait, then `timeout`.
    """
    remaining = overall.remaining()
    if request.max_wait_ms is None or remaining is None:
        return request
    return request.with_max_wait_ms(wait_ms(max(0.0, remaining - timeout)))


#: Most headers one feedback carries, and the longest name or value (the daemon's bounds).
MAX_FEEDBACK_HEADERS = 64
MAX_HEADER_LEN = 256

#: The headers the daemon reads (names in lower case): the pause of a 429, and
#: OpenAI's and Anthropic's limit, remaining and reset per dimension.
FEEDBACK_HEADERS = frozenset(
    ["retry-after", "retry-after-ms"]
    + [
        f"x-ratelimit-{kind}-{dimension}"
        for kind in ("limit", "remaining", "reset")
        for dimension in ("requests", "tokens")
    ]
    + [
        f"anthropic-ratelimit-{dimension}-{kind}"
        for kind in ("limit", "remaining", "reset")
        for dimension in ("requests", "tokens", "input-tokens", "output-tokens")
    ]
)


def rate_limit_headers(headers: Any) -> tuple[p.Header, ...]:
    """The rate-limit headers of a provider's answer, as the wire's.

    `headers` is a mapping (httpx's, a dict) or an iterable of (name, value)
    pairs. Only the headers the daemon reads are kept, and none too long to
    send, so that a feedback is small and never refused for its size.
    """
    if headers is None:
        return ()
    items = headers.items() if hasattr(headers, "items") else headers
    kept = []
    for name, value in items:
        name = str(name).lower()
        value = str(value)
        if name in FEEDBACK_HEADERS and len(value) <= MAX_HEADER_LEN:
            kept.append(p.Header(name, value))
    return tuple(kept[:MAX_FEEDBACK_HEADERS])


def build_feedback(limit: str, status: int, headers: Any, since_grant: float) -> p.Feedback:
    """The feedback of a provider's answer: its status and rate-limit headers."""
    if not isinstance(status, int) or not 100 <= status <= 599:
        raise ValueError(f"status must be an HTTP status code, got {status!r}")
    since_ms = wait_ms(since_grant)
    return p.Feedback(limit, status, since_ms or 0, rate_limit_headers(headers))


def report_counts(
    used: Optional[int], input_tokens: Optional[int], output_tokens: Optional[int]
) -> tuple[int, int]:
    """`report(used)` or `report(input_tokens=, output_tokens=)` as the wire's two counts.

    A single total is sent as input tokens: limits that share one token bucket
    only look at the sum. (The cache figures, checked by `cache_counts`, come
    on top.)
    """
    if type(used) is int and used >= 0 and input_tokens is None and output_tokens is None:
        return used, 0  # the usual: report(total)
    if used is not None:
        if input_tokens is not None or output_tokens is not None:
            raise ValueError("give either used or input_tokens/output_tokens, not both")
        return token_count("used", used), 0
    if input_tokens is None and output_tokens is None:
        raise ValueError("report needs used, or input_tokens and/or output_tokens")
    return (
        0 if input_tokens is None else token_count("input_tokens", input_tokens),
        0 if output_tokens is None else token_count("output_tokens", output_tokens),
    )


def cache_counts(cached_input_tokens: int, cache_write_tokens: int) -> tuple[int, int]:
    """A report's cache reads and writes, checked as token counts."""
    if cached_input_tokens == 0 and cache_write_tokens == 0:
        return 0, 0  # the usual: no cache figures
    return (
        token_count("cached_input_tokens", cached_input_tokens),
        token_count("cache_write_tokens", cache_write_tokens),
    )
