"""The wire protocol, sans I/O: message types, encoding, decoding and framing.

This module is the client's only parser (PROTOCOL.md is normative). It never
touches a socket: `encode_frame` turns a frame into bytes and `FrameDecoder`
turns received bytes into frames, or `NEED_DATA` until a whole frame is there.
The sync and asyncio clients are thin shells around it.

Every message is a frozen dataclass whose class attribute `WIRE` lists its
fields in wire order with their wire types; one generic walker encodes and
decodes them all, so the layout of each message is written down once.
"""

from __future__ import annotations

import dataclasses
import struct
from dataclasses import dataclass, field
from typing import Any, ClassVar, Optional, Union

from ._errors import FrameTooLarge, MalformedMessage, RatekeeperError, error_for_code

#: The protocol version this client speaks.
PROTOCOL_VERSION = 1
#: Largest payload (length prefix not included), PROTOCOL.md §8.
MAX_FRAME_LEN = 4 * 1024 * 1024
#: Most unanswered requests per connection the daemon allows by default.
MAX_IN_FLIGHT = 1024
#: Longest name (limit, tenant, priority, client name, role) in UTF-8 bytes.
MAX_NAME_LEN = 128
#: Bytes of the length prefix of every frame.
LENGTH_PREFIX_LEN = 4

_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_I64 = struct.Struct("<q")


class _NeedData:
    """The type of `NEED_DATA`."""

    _instance: ClassVar[Optional[_NeedData]] = None

    def __new__(cls) -> _NeedData:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "NEED_DATA"


#: Returned by `FrameDecoder.next_frame` while no complete frame is buffered.
NEED_DATA = _NeedData()


# ---------------------------------------------------------------------------
# Wire types
# ---------------------------------------------------------------------------


class _Reader:
    """A cursor over one payload that refuses to read past its end."""

    __slots__ = ("data", "pos")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def take(self, size: int) -> bytes:
        end = self.pos + size
        if size < 0 or end > len(self.data):
            raise MalformedMessage(
                f"truncated: {size} bytes needed at offset {self.pos}, "
                f"{len(self.data) - self.pos} left"
            )
        chunk = self.data[self.pos : end]
        self.pos = end
        return chunk

    def unpack(self, fmt: struct.Struct) -> Any:
        end = self.pos + fmt.size
        if end > len(self.data):
            raise MalformedMessage(f"truncated field at offset {self.pos}")
        (value,) = fmt.unpack_from(self.data, self.pos)
        self.pos = end
        return value

    def remaining(self) -> int:
        return len(self.data) - self.pos


class WireType:
    """How one value is laid out on the wire."""

    def encode(self, out: bytearray, value: Any) -> None:
        raise NotImplementedError

    def decode(self, reader: _Reader) -> Any:
        raise NotImplementedError


class _Int(WireType):
    def __init__(self, name: str, fmt: struct.Struct) -> None:
        self.name = name
        self.fmt = fmt

    def encode(self, out: bytearray, value: Any) -> None:
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{self.name} must be an int, got {type(value).__name__}")
        try:
            out += self.fmt.pack(value)
        except struct.error:
            raise ValueError(f"{value} does not fit in a {self.name}") from None

    def decode(self, reader: _Reader) -> Any:
        return reader.unpack(self.fmt)

    def __repr__(self) -> str:
        return self.name


class _Bool(WireType):
    def encode(self, out: bytearray, value: Any) -> None:
        if not isinstance(value, bool):
            raise TypeError(f"bool expected, got {type(value).__name__}")
        out.append(1 if value else 0)

    def decode(self, reader: _Reader) -> Any:
        byte = reader.take(1)[0]
        if byte > 1:
            raise MalformedMessage(f"bool byte {byte} is neither 0 nor 1")
        return byte == 1

    def __repr__(self) -> str:
        return "bool"


class _Str(WireType):
    def encode(self, out: bytearray, value: Any) -> None:
        if not isinstance(value, str):
            raise TypeError(f"str expected, got {type(value).__name__}")
        data = value.encode("utf-8")
        out += _U64.pack(len(data))
        out += data

    def decode(self, reader: _Reader) -> Any:
        size = reader.unpack(_U64)
        if size > reader.remaining():
            raise MalformedMessage(f"string of {size} bytes runs past the end of the payload")
        try:
            return reader.take(size).decode("utf-8")
        except UnicodeDecodeError as error:
            raise MalformedMessage(f"invalid UTF-8 in a string: {error}") from None

    def __repr__(self) -> str:
        return "String"


class Opt(WireType):
    """`Option<T>`: byte 0 for None, byte 1 and the value for Some."""

    def __init__(self, inner: WireType) -> None:
        self.inner = inner

    def encode(self, out: bytearray, value: Any) -> None:
        if value is None:
            out.append(0)
        else:
            out.append(1)
            self.inner.encode(out, value)

    def decode(self, reader: _Reader) -> Any:
        tag = reader.take(1)[0]
        if tag == 0:
            return None
        if tag == 1:
            return self.inner.decode(reader)
        raise MalformedMessage(f"Option tag {tag} is neither 0 nor 1")

    def __repr__(self) -> str:
        return f"Option<{self.inner!r}>"


class Vec(WireType):
    """`Vec<T>`: a u64 count, then the elements (stored as a tuple)."""

    def __init__(self, inner: WireType) -> None:
        self.inner = inner

    def encode(self, out: bytearray, value: Any) -> None:
        items = tuple(value)
        out += _U64.pack(len(items))
        for item in items:
            self.inner.encode(out, item)

    def decode(self, reader: _Reader) -> Any:
        count = reader.unpack(_U64)
        # Every element takes at least one byte: refuse counts the payload
        # cannot hold before building anything for them.
        if count > reader.remaining():
            raise MalformedMessage(f"list of {count} elements runs past the end of the payload")
        return tuple(self.inner.decode(reader) for _ in range(count))

    def __repr__(self) -> str:
        return f"Vec<{self.inner!r}>"


class Struct(WireType):
    """A message struct: its `WIRE` fields in order, nothing between them."""

    def __init__(self, cls: type) -> None:
        self.cls = cls

    def encode(self, out: bytearray, value: Any) -> None:
        if not isinstance(value, self.cls):
            raise TypeError(f"{self.cls.__name__} expected, got {type(value).__name__}")
        _encode_fields(out, value)

    def decode(self, reader: _Reader) -> Any:
        return _decode_fields(reader, self.cls)

    def __repr__(self) -> str:
        return self.cls.__name__


class Enum(WireType):
    """An enum: a u32 tag (the variant's index), then the variant's fields."""

    def __init__(self, name: str, variants: tuple[type, ...]) -> None:
        self.name = name
        self.variants = variants
        for tag, variant in enumerate(variants):
            variant.TAG = tag

    def encode(self, out: bytearray, value: Any) -> None:
        variant = type(value)
        tag = getattr(variant, "TAG", None)
        if tag is None or tag >= len(self.variants) or self.variants[tag] is not variant:
            raise TypeError(f"{variant.__name__} is not a variant of {self.name}")
        out += _U32.pack(tag)
        _encode_fields(out, value)

    def decode(self, reader: _Reader) -> Any:
        tag = reader.unpack(_U32)
        if tag >= len(self.variants):
            raise MalformedMessage(f"unknown {self.name} tag {tag}")
        return _decode_fields(reader, self.variants[tag])

    def __repr__(self) -> str:
        return self.name


U16 = _Int("u16", _U16)
U32 = _Int("u32", _U32)
U64 = _Int("u64", _U64)
I64 = _Int("i64", _I64)
BOOL = _Bool()
STR = _Str()


class _Plan:
    """A struct's `WIRE` compiled for speed: runs of fixed-width integers are
    packed and unpacked with one `struct.Struct`, other fields one by one."""

    __slots__ = ("names", "positional", "steps")

    def __init__(self, cls: type) -> None:
        wire = cls.WIRE
        self.names = tuple(name for name, _ in wire)
        # Constructed positionally when the dataclass declares its fields in wire order.
        declared = tuple(f.name for f in dataclasses.fields(cls))
        self.positional = declared[: len(self.names)] == self.names
        self.steps: list[tuple[Optional[struct.Struct], tuple[str, ...], Any]] = []
        run: list[tuple[str, _Int]] = []

        def close_run() -> None:
            if run:
                fmt = struct.Struct("<" + "".join(t.fmt.format[1:] for _, t in run))
                self.steps.append((fmt, tuple(name for name, _ in run), tuple(run)))
                run.clear()

        for name, wire_type in wire:
            if isinstance(wire_type, _Int):
                run.append((name, wire_type))
            else:
                close_run()
                self.steps.append((None, (name,), wire_type))
        close_run()

    def encode(self, out: bytearray, value: Any) -> None:
        for fixed, names, wire in self.steps:
            if fixed is None:
                wire.encode(out, getattr(value, names[0]))
                continue
            values = [getattr(value, name) for name in names]
            try:
                out += fixed.pack(*values)
            except struct.error:
                for (_, int_type), item in zip(wire, values):
                    int_type.encode(out, item)  # raises the precise error
                raise

    def decode(self, reader: _Reader, cls: type) -> Any:
        values: list[Any] = []
        for fixed, _, wire in self.steps:
            if fixed is None:
                values.append(wire.decode(reader))
                continue
            end = reader.pos + fixed.size
            if end > len(reader.data):
                raise MalformedMessage(f"truncated field at offset {reader.pos}")
            values.extend(fixed.unpack_from(reader.data, reader.pos))
            reader.pos = end
        if self.positional:
            return cls(*values)
        return cls(**dict(zip(self.names, values)))


def _plan(cls: type) -> _Plan:
    plan = cls.__dict__.get("_PLAN")
    if plan is None:
        plan = _Plan(cls)
        cls._PLAN = plan
    return plan


def _encode_fields(out: bytearray, value: Any) -> None:
    _plan(type(value)).encode(out, value)


def _decode_fields(reader: _Reader, cls: type) -> Any:
    return _plan(cls).decode(reader, cls)


# ---------------------------------------------------------------------------
# Messages (PROTOCOL.md §4)
# ---------------------------------------------------------------------------


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


Cost = Union[TokenCost, ChatRequest]


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


Request = Union[Hello, Acquire, Report, Release, Cancel, Estimate, Status, Ping]


@dataclass(frozen=True)
class HelloReply:
    """Response 0: the version in use and the bounds the daemon enforces."""

    protocol_version: int
    server: str
    max_frame_len: int
    max_in_flight: int
    WIRE: ClassVar[tuple] = ()
    TAG: ClassVar[int]


@dataclass(frozen=True)
class Granted:
    """Response 1: the cost is reserved under `lease`; call the provider now."""

    lease: int
    tokens: int
    waited_ms: int
    WIRE: ClassVar[tuple] = ()
    TAG: ClassVar[int]


@dataclass(frozen=True)
class Denied:
    """Response 2: not grantable within the wait; nothing reserved."""

    retry_after_ms: int
    bucket: str
    WIRE: ClassVar[tuple] = ()
    TAG: ClassVar[int]


@dataclass(frozen=True)
class Settled:
    """Response 3: reserved - used went back (negative: an overrun was debited)."""

    tokens_returned: int
    WIRE: ClassVar[tuple] = ()
    TAG: ClassVar[int]


@dataclass(frozen=True)
class Released:
    """Response 4: the whole reservation went back."""

    tokens_returned: int
    WIRE: ClassVar[tuple] = ()
    TAG: ClassVar[int]


@dataclass(frozen=True)
class CancelReply:
    """Response 5 (`Cancelled`): whether an unanswered acquire with that id existed."""

    found: bool
    WIRE: ClassVar[tuple] = ()
    TAG: ClassVar[int]


@dataclass(frozen=True)
class Estimated:
    """Response 6: what an acquire with that cost would reserve."""

    input_tokens: int
    output_tokens: int
    WIRE: ClassVar[tuple] = ()
    TAG: ClassVar[int]


@dataclass(frozen=True)
class BucketStatus:
    """One bucket of a limit: capacity, current level (negative while acquires wait), rate."""

    name: str
    capacity: int
    level: int
    per_minute: int
    WIRE: ClassVar[tuple] = ()


@dataclass(frozen=True)
class LimitStatus:
    """One limit: its buckets and how many acquires this daemon holds back for it."""

    name: str
    waiters: int
    buckets: tuple[BucketStatus, ...] = field(default_factory=tuple)
    WIRE: ClassVar[tuple] = ()

    def bucket(self, name: str) -> Optional[BucketStatus]:
        """The bucket called `name`, if the limit has one."""
        return next((b for b in self.buckets if b.name == name), None)


@dataclass(frozen=True)
class StatusReply:
    """Response 7 (`Status`): the store kind and the limits asked for."""

    store: str
    limits: tuple[LimitStatus, ...] = ()
    WIRE: ClassVar[tuple] = ()
    TAG: ClassVar[int]

    def limit(self, name: str) -> Optional[LimitStatus]:
        """The status of the limit called `name`, if it was listed."""
        return next((lim for lim in self.limits if lim.name == name), None)


@dataclass(frozen=True)
class Pong:
    """Response 8: answer to `Ping`."""

    WIRE: ClassVar[tuple] = ()
    TAG: ClassVar[int]


@dataclass(frozen=True)
class ErrorReply:
    """Response 9 (`Error`): a stable `code` and a message for humans."""

    code: int
    message: str
    WIRE: ClassVar[tuple] = ()
    TAG: ClassVar[int]

    def exception(self) -> RatekeeperError:
        """The exception class mapped one to one from `code`."""
        return error_for_code(self.code, self.message)


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
]


COST = Enum("Cost", (TokenCost, ChatRequest))
REQUEST = Enum("Request", (Hello, Acquire, Report, Release, Cancel, Estimate, Status, Ping))
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


# ---------------------------------------------------------------------------
# Framing (PROTOCOL.md §2)
# ---------------------------------------------------------------------------


def encode_payload(frame: Frame) -> bytes:
    """The payload bytes of `frame` (no length prefix)."""
    out = bytearray()
    _encode_fields(out, frame)
    return bytes(out)


def encode_frame(frame: Frame, max_frame_len: int = MAX_FRAME_LEN) -> bytes:
    """`frame` as it goes on the wire: u32 little-endian length, then the payload.

    Raises `FrameTooLarge` when the payload exceeds `max_frame_len`, before
    anything is sent.
    """
    out = bytearray(LENGTH_PREFIX_LEN)
    _encode_fields(out, frame)
    size = len(out) - LENGTH_PREFIX_LEN
    if size > max_frame_len:
        raise FrameTooLarge(f"a frame of {size} bytes exceeds the maximum of {max_frame_len}")
    _U32.pack_into(out, 0, size)
    return bytes(out)


def decode_payload(payload: bytes, frame_type: type = ServerFrame) -> Any:
    """Decodes one payload holding exactly one `frame_type`; raises `MalformedMessage`."""
    if not payload:
        raise MalformedMessage("empty payload")
    reader = _Reader(payload)
    frame = _decode_fields(reader, frame_type)
    if reader.remaining():
        raise MalformedMessage(f"{reader.remaining()} trailing bytes after the message")
    return frame


class FrameDecoder:
    """Turns a byte stream into frames, without I/O.

    Feed received bytes with `receive_data`; `next_frame` returns the next
    decoded frame or `NEED_DATA`. A length prefix above `max_frame_len` raises
    `FrameTooLarge` as soon as its 4 bytes are there, before any of the payload
    is buffered; the stream is then unusable (the next frame cannot be found).
    A payload that does not decode raises `MalformedMessage` after the frame was
    consumed, so decoding can go on with the next frame.
    """

    def __init__(self, frame_type: type = ServerFrame, max_frame_len: int = MAX_FRAME_LEN) -> None:
        self.frame_type = frame_type
        self.max_frame_len = max_frame_len
        self._buffer = bytearray()
        self._broken: Optional[FrameTooLarge] = None

    def receive_data(self, data: bytes) -> None:
        """Appends received bytes."""
        if self._broken is None:
            self._buffer += data

    @property
    def buffered(self) -> int:
        """Bytes received but not yet returned as frames."""
        return len(self._buffer)

    def next_frame(self) -> Any:
        """The next complete frame, or `NEED_DATA`."""
        if self._broken is not None:
            raise self._broken
        buffer = self._buffer
        if len(buffer) < LENGTH_PREFIX_LEN:
            return NEED_DATA
        (size,) = _U32.unpack_from(buffer, 0)
        if size > self.max_frame_len:
            self._broken = FrameTooLarge(
                f"the peer announced a frame of {size} bytes; the maximum is {self.max_frame_len}"
            )
            self._buffer = bytearray()
            raise self._broken
        end = LENGTH_PREFIX_LEN + size
        if len(buffer) < end:
            return NEED_DATA
        payload = bytes(buffer[LENGTH_PREFIX_LEN:end])
        del buffer[:end]
        return decode_payload(payload, self.frame_type)

    def frames(self) -> list[Any]:
        """Every complete frame buffered now (stops at the first error, raising it)."""
        out = []
        while True:
            frame = self.next_frame()
            if frame is NEED_DATA:
                return out
            out.append(frame)


def decode_frame(data: bytes, frame_type: type = ServerFrame) -> Any:
    """Decodes bytes that hold exactly one whole frame, length prefix included."""
    decoder = FrameDecoder(frame_type)
    decoder.receive_data(data)
    frame = decoder.next_frame()
    if frame is NEED_DATA:
        raise MalformedMessage(f"{len(data)} bytes do not hold a whole frame")
    if decoder.buffered:
        raise MalformedMessage(f"{decoder.buffered} bytes after the frame")
    return frame
