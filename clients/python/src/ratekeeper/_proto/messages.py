"""The messages of PROTOCOL.md §4, sans I/O: one frozen dataclass each.

Each message's class attribute `WIRE` lists its fields in wire order with their
wire types (from `wire`); the tables after the classes (and the two frame
structs at the end) are the only place the layout of a message is written
down. An enum (`COST`, `REQUEST`, `RESPONSE`) numbers its variants by their
order, so the tuples below are the spec's tags.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Optional, Union

from .answers import (
    BucketInspection,
    BucketStatus,
    BudgetsReply,
    BudgetStatus,
    CancelReply,
    Denied,
    ErrorReply,
    Estimated,
    Granted,
    HealthReply,
    HelloReply,
    InspectReply,
    LimitInspection,
    LimitStatus,
    Noted,
    Pong,
    Released,
    Settled,
    StatusReply,
)
from .wire import BOOL, I64, STR, U16, U32, U64, Enum, Opt, Struct, Vec


@dataclass(frozen=True)
class TokenCost:
    """`Cost::Tokens`: counts the client knows (prompt, and output to reserve)."""

    input_tokens: int
    output_tokens: int = 0
    WIRE: ClassVar[tuple] = ()
    TAG: ClassVar[int]


@dataclass(frozen=True)
class ChatMessage:
    """One chat message for the daemon to count: its text parts, tool calls as JSON."""

    role: str
    content: tuple[str, ...] = ()
    name: Optional[str] = None
    tool_calls_json: Optional[str] = None
    WIRE: ClassVar[tuple] = ()


@dataclass(frozen=True)
class ChatRequest:
    """`Cost::Messages`: the chat request, counted by the daemon's tokenizer."""

    messages: tuple[ChatMessage, ...]
    tools_json: Optional[str] = None
    max_output_tokens: Optional[int] = None
    WIRE: ClassVar[tuple] = ()
    TAG: ClassVar[int]


@dataclass(frozen=True)
class TextBlock:
    """`Block::Text`: text to count (a text block, a tool's name or input, a result)."""

    text: str
    WIRE: ClassVar[tuple] = ()
    TAG: ClassVar[int]


@dataclass(frozen=True)
class ImageBlock:
    """`Block::Image`: an image's size in pixels (0 x 0: unknown) and OpenAI's `detail`."""

    width: int = 0
    height: int = 0
    detail: str = ""
    WIRE: ClassVar[tuple] = ()
    TAG: ClassVar[int]


Block = Union[TextBlock, ImageBlock]


@dataclass(frozen=True)
class Turn:
    """One message of a `Conversation`: its content blocks, tool calls as JSON."""

    role: str
    blocks: tuple[Block, ...] = ()
    name: Optional[str] = None
    tool_calls_json: Optional[str] = None
    WIRE: ClassVar[tuple] = ()


@dataclass(frozen=True)
class Conversation:
    """`Cost::Conversation` (revision 4): content blocks in `api`'s shape, with images."""

    api: str
    messages: tuple[Turn, ...] = ()
    system: tuple[str, ...] = ()
    tools_json: Optional[str] = None
    max_output_tokens: Optional[int] = None
    WIRE: ClassVar[tuple] = ()
    TAG: ClassVar[int]


Cost = Union[TokenCost, ChatRequest, Conversation]


@dataclass(frozen=True)
class Hello:
    """Request 0: the first frame of every connection."""

    protocol_version: int
    client_name: str
    WIRE: ClassVar[tuple] = ()
    TAG: ClassVar[int]


@dataclass(frozen=True)
class Acquire:
    """Request 1: reserve `cost` in every bucket of `limit`, waiting up to `max_wait_ms`."""

    limit: str
    cost: Cost
    tenant: Optional[str] = None
    priority: Optional[str] = None
    max_wait_ms: Optional[int] = None
    WIRE: ClassVar[tuple] = ()
    TAG: ClassVar[int]


@dataclass(frozen=True)
class Report:
    """Request 2: settle a lease with the usage the provider reported."""

    lease: int
    input_tokens: int
    output_tokens: int
    WIRE: ClassVar[tuple] = ()
    TAG: ClassVar[int]


@dataclass(frozen=True)
class Release:
    """Request 3: give a lease back unused."""

    lease: int
    WIRE: ClassVar[tuple] = ()
    TAG: ClassVar[int]


@dataclass(frozen=True)
class Cancel:
    """Request 4: abandon the unanswered acquire sent with `request_id`."""

    request_id: int
    WIRE: ClassVar[tuple] = ()
    TAG: ClassVar[int]


@dataclass(frozen=True)
class Estimate:
    """Request 5: what an acquire of `cost` on `limit` would reserve."""

    limit: str
    cost: Cost
    WIRE: ClassVar[tuple] = ()
    TAG: ClassVar[int]


@dataclass(frozen=True)
class Status:
    """Request 6: bucket levels of one limit, or of all when `limit` is None."""

    limit: Optional[str] = None
    WIRE: ClassVar[tuple] = ()
    TAG: ClassVar[int]


@dataclass(frozen=True)
class Ping:
    """Request 7: liveness."""

    WIRE: ClassVar[tuple] = ()
    TAG: ClassVar[int]


@dataclass(frozen=True)
class Health:
    """Request 8 (revision 2): can the daemon serve acquires now, and why."""

    WIRE: ClassVar[tuple] = ()
    TAG: ClassVar[int]


@dataclass(frozen=True)
class Inspect:
    """Request 9 (revision 2): the store's state and one limit's buckets (all when None)."""

    limit: Optional[str] = None
    WIRE: ClassVar[tuple] = ()
    TAG: ClassVar[int]


@dataclass(frozen=True)
class Header:
    """One HTTP header of a provider's answer, name in lower case."""

    name: str
    value: str
    WIRE: ClassVar[tuple] = ()


@dataclass(frozen=True)
class Feedback:
    """Request 10 (revision 3): what the provider answered a call on `limit`."""

    limit: str
    status: int
    since_grant_ms: int = 0
    headers: tuple[Header, ...] = ()
    WIRE: ClassVar[tuple] = ()
    TAG: ClassVar[int]


@dataclass(frozen=True)
class LeaseFeedback:
    """Request 11 (revision 5): `Feedback` naming the lease of the call it answers,
    which the daemon places exactly."""

    lease: int
    feedback: Feedback
    WIRE: ClassVar[tuple] = ()
    TAG: ClassVar[int]


@dataclass(frozen=True)
class Usage:
    """What a call used in four disjoint kinds of token, as providers bill them
    (revision 6): `input_tokens` is the full-price input only, neither read from
    nor written to the prompt cache; cache reads and writes are apart."""

    input_tokens: int
    cached_input_tokens: int = 0
    cache_write_tokens: int = 0
    output_tokens: int = 0
    WIRE: ClassVar[tuple] = ()


@dataclass(frozen=True)
class UsageReport:
    """Request 12 (revision 6): `Report` with the usage split by kind of token,
    so that spend budgets price it; answered by `Settled`."""

    lease: int
    usage: Usage
    WIRE: ClassVar[tuple] = ()
    TAG: ClassVar[int]


@dataclass(frozen=True)
class Budgets:
    """Request 13 (revision 6): the spend budgets of one limit (all when None)."""

    limit: Optional[str] = None
    WIRE: ClassVar[tuple] = ()
    TAG: ClassVar[int]


Request = Union[
    Hello,
    Acquire,
    Report,
    Release,
    Cancel,
    Estimate,
    Status,
    Ping,
    Health,
    Inspect,
    Feedback,
    LeaseFeedback,
    UsageReport,
    Budgets,
]


Response = Union[
    HelloReply,
    Granted,
    Denied,
    Settled,
    Released,
    CancelReply,
    Estimated,
    StatusReply,
    Pong,
    ErrorReply,
    HealthReply,
    InspectReply,
    Noted,
    BudgetsReply,
]


COST = Enum("Cost", (TokenCost, ChatRequest, Conversation))
BLOCK = Enum("Block", (TextBlock, ImageBlock))
REQUEST = Enum(
    "Request",
    (
        Hello,
        Acquire,
        Report,
        Release,
        Cancel,
        Estimate,
        Status,
        Ping,
        Health,
        Inspect,
        Feedback,
        LeaseFeedback,
        UsageReport,
        Budgets,
    ),
)
RESPONSE = Enum(
    "Response",
    (
        HelloReply,
        Granted,
        Denied,
        Settled,
        Released,
        CancelReply,
        Estimated,
        StatusReply,
        Pong,
        ErrorReply,
        HealthReply,
        InspectReply,
        Noted,
        BudgetsReply,
    ),
)

TokenCost.WIRE = (("input_tokens", U64), ("output_tokens", U64))
ChatMessage.WIRE = (
    ("role", STR),
    ("name", Opt(STR)),
    ("content", Vec(STR)),
    ("tool_calls_json", Opt(STR)),
)
ChatRequest.WIRE = (
    ("messages", Vec(Struct(ChatMessage))),
    ("tools_json", Opt(STR)),
    ("max_output_tokens", Opt(U64)),
)
TextBlock.WIRE = (("text", STR),)
ImageBlock.WIRE = (("width", U32), ("height", U32), ("detail", STR))
Turn.WIRE = (
    ("role", STR),
    ("name", Opt(STR)),
    ("blocks", Vec(BLOCK)),
    ("tool_calls_json", Opt(STR)),
)
Conversation.WIRE = (
    ("api", STR),
    ("system", Vec(STR)),
    ("messages", Vec(Struct(Turn))),
    ("tools_json", Opt(STR)),
    ("max_output_tokens", Opt(U64)),
)
Hello.WIRE = (("protocol_version", U16), ("client_name", STR))
Acquire.WIRE = (
    ("limit", STR),
    ("tenant", Opt(STR)),
    ("priority", Opt(STR)),
    ("cost", COST),
    ("max_wait_ms", Opt(U64)),
)
Report.WIRE = (("lease", U64), ("input_tokens", U64), ("output_tokens", U64))
Release.WIRE = (("lease", U64),)
Cancel.WIRE = (("request_id", U64),)
Estimate.WIRE = (("limit", STR), ("cost", COST))
Status.WIRE = (("limit", Opt(STR)),)
HelloReply.WIRE = (
    ("protocol_version", U16),
    ("server", STR),
    ("max_frame_len", U32),
    ("max_in_flight", U32),
)
Granted.WIRE = (("lease", U64), ("tokens", U64), ("waited_ms", U64))
Denied.WIRE = (("retry_after_ms", U64), ("bucket", STR))
Settled.WIRE = (("tokens_returned", I64),)
Released.WIRE = (("tokens_returned", U64),)
CancelReply.WIRE = (("found", BOOL),)
Estimated.WIRE = (("input_tokens", U64), ("output_tokens", U64))
BucketStatus.WIRE = (("name", STR), ("capacity", U64), ("level", I64), ("per_minute", U64))
LimitStatus.WIRE = (("name", STR), ("waiters", U64), ("buckets", Vec(Struct(BucketStatus))))
StatusReply.WIRE = (("store", STR), ("limits", Vec(Struct(LimitStatus))))
ErrorReply.WIRE = (("code", U16), ("message", STR))
Inspect.WIRE = (("limit", Opt(STR)),)
HealthReply.WIRE = (
    ("ready", BOOL),
    ("store", STR),
    ("store_up", BOOL),
    ("store_down_ms", U64),
    ("policy", STR),
    ("reason", STR),
)
BucketInspection.WIRE = (
    ("name", STR),
    ("tenant", Opt(STR)),
    ("capacity", U64),
    ("per_minute", U64),
    ("level", Opt(I64)),
)
LimitInspection.WIRE = (
    ("name", STR),
    ("waiters", U64),
    ("buckets", Vec(Struct(BucketInspection))),
)
Header.WIRE = (("name", STR), ("value", STR))
Feedback.WIRE = (
    ("limit", STR),
    ("status", U16),
    ("since_grant_ms", U64),
    ("headers", Vec(Struct(Header))),
)
LeaseFeedback.WIRE = (("lease", U64), ("feedback", Struct(Feedback)))
Usage.WIRE = (
    ("input_tokens", U64),
    ("cached_input_tokens", U64),
    ("cache_write_tokens", U64),
    ("output_tokens", U64),
)
UsageReport.WIRE = (("lease", U64), ("usage", Struct(Usage)))
Noted.WIRE = (("paused_ms", U64), ("lowered", U32))
InspectReply.WIRE = (
    ("health", Struct(HealthReply)),
    ("levels_from", STR),
    ("limits", Vec(Struct(LimitInspection))),
)
Budgets.WIRE = (("limit", Opt(STR)),)
BudgetStatus.WIRE = (
    ("owner", STR),
    ("group", BOOL),
    ("tenant", Opt(STR)),
    ("name", STR),
    ("period", STR),
    ("amount", U64),
    ("spent", U64),
    ("reserved", U64),
    ("remaining", I64),
    ("resets_at_ms", U64),
)
BudgetsReply.WIRE = (("budgets", Vec(Struct(BudgetStatus))),)


@dataclass(frozen=True)
class ClientFrame:
    """What a client sends: a request and the id its answer will carry."""

    request_id: int
    request: Request
    WIRE: ClassVar[tuple] = (("request_id", U64), ("request", REQUEST))


@dataclass(frozen=True)
class ServerFrame:
    """What the daemon sends: the answer to `request_id` (0: the connection's own error)."""

    request_id: int
    response: Response
    WIRE: ClassVar[tuple] = (("request_id", U64), ("response", RESPONSE))


Frame = Union[ClientFrame, ServerFrame]
