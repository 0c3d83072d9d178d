"""The wire protocol, sans I/O: framing, and the one namespace of the codec.

This module and the two below it are the client's only parser (PROTOCOL.md is
normative). They never touch a socket: `encode_frame` turns a frame into bytes
and `FrameDecoder` turns received bytes into frames, or `NEED_DATA` until a
whole frame is there. The sync and asyncio clients are thin shells around it.

- `_wire`: how values are laid out (integers, strings, options, lists, structs,
  enums), one generic walker for every message;
- `_messages`: the messages themselves and their layouts;
- here: the length-prefixed framing (§2) and the bounds of §8. The messages and
  wire types are re-exported, so callers write `p.Acquire`, `p.encode_frame`.
"""

from __future__ import annotations

import struct
from typing import Any, ClassVar, Optional

from ._errors import FrameTooLarge, MalformedMessage
from ._messages import (
    COST,
    REQUEST,
    RESPONSE,
    Acquire,
    BucketInspection,
    BucketStatus,
    Cancel,
    CancelReply,
    ChatMessage,
    ChatRequest,
    ClientFrame,
    Cost,
    Denied,
    ErrorReply,
    Estimate,
    Estimated,
    Frame,
    Granted,
    Health,
    HealthReply,
    Hello,
    HelloReply,
    Inspect,
    InspectReply,
    LimitInspection,
    LimitStatus,
    Ping,
    Pong,
    Release,
    Released,
    Report,
    Request,
    Response,
    ServerFrame,
    Settled,
    Status,
    StatusReply,
    TokenCost,
)
from ._wire import (
    BOOL,
    I64,
    STR,
    U16,
    U32,
    U64,
    Enum,
    Opt,
    Reader,
    Struct,
    Vec,
    WireType,
    decode_fields,
    encode_fields,
)

__all__ = [
    "BOOL",
    "COST",
    "I64",
    "LENGTH_PREFIX_LEN",
    "MAX_FRAME_LEN",
    "MAX_IN_FLIGHT",
    "MAX_NAME_LEN",
    "NEED_DATA",
    "PROTOCOL_VERSION",
    "REQUEST",
    "RESPONSE",
    "STR",
    "U16",
    "U32",
    "U64",
    "Acquire",
    "BucketInspection",
    "BucketStatus",
    "Cancel",
    "CancelReply",
    "ChatMessage",
    "ChatRequest",
    "ClientFrame",
    "Cost",
    "Denied",
    "Enum",
    "ErrorReply",
    "Estimate",
    "Estimated",
    "Frame",
    "FrameDecoder",
    "Granted",
    "Health",
    "HealthReply",
    "Hello",
    "HelloReply",
    "Inspect",
    "InspectReply",
    "LimitInspection",
    "LimitStatus",
    "Opt",
    "Ping",
    "Pong",
    "Release",
    "Released",
    "Report",
    "Request",
    "Response",
    "ServerFrame",
    "Settled",
    "Status",
    "StatusReply",
    "Struct",
    "TokenCost",
    "Vec",
    "WireType",
    "decode_frame",
    "decode_payload",
    "encode_frame",
    "encode_payload",
]

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

_LENGTH = struct.Struct("<I")


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
# Framing (PROTOCOL.md §2)
# ---------------------------------------------------------------------------


def encode_payload(frame: Frame) -> bytes:
    """The payload bytes of `frame` (no length prefix)."""
    out = bytearray()
    encode_fields(out, frame)
    return bytes(out)


def encode_frame(frame: Frame, max_frame_len: int = MAX_FRAME_LEN) -> bytes:
    """`frame` as it goes on the wire: u32 little-endian length, then the payload.

    Raises `FrameTooLarge` when the payload exceeds `max_frame_len`, before
    anything is sent.
    """
    out = bytearray(LENGTH_PREFIX_LEN)
    encode_fields(out, frame)
    size = len(out) - LENGTH_PREFIX_LEN
    if size > max_frame_len:
        raise FrameTooLarge(f"a frame of {size} bytes exceeds the maximum of {max_frame_len}")
    _LENGTH.pack_into(out, 0, size)
    return bytes(out)


def decode_payload(payload: bytes, frame_type: type = ServerFrame) -> Any:
    """Decodes one payload holding exactly one `frame_type`; raises `MalformedMessage`."""
    if not payload:
        raise MalformedMessage("empty payload")
    reader = Reader(payload)
    frame = decode_fields(reader, frame_type)
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
        (size,) = _LENGTH.unpack_from(buffer, 0)
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
