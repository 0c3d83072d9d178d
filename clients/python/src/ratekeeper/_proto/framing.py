"""Framing, sans I/O: the length-prefixed frames of PROTOCOL.md §2 and the bounds of §8.

`encode_frame` turns a frame into bytes and `FrameDecoder` turns received
bytes into frames, or `NEED_DATA` until a whole frame is there; neither
touches a socket. The hot frames are packed and unpacked with the layouts
`fixed` precompiles from the declarations (`encode_request`,
`FrameDecoder.next_answer`).
"""

from __future__ import annotations

import struct
from typing import Any, ClassVar, Optional

from .errors import FrameTooLarge, MalformedMessage
from .fixed import FIXED_ANSWERS, FIXED_REQUESTS
from .messages import ClientFrame, Frame, Request, ServerFrame
from .wire import Reader, decode_fields, encode_fields

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

#: Bytes the decoder's buffer holds between frames (it grows for a larger one).
BUFFER_SIZE = 64 * 1024
#: Free bytes `FrameDecoder.get_buffer` offers at least.
MIN_FREE = 4 * 1024

_LENGTH = struct.Struct("<I")
#: A client frame's head: the length prefix and `ClientFrame.request_id`.
FRAME_HEAD = struct.Struct("<IQ")
#: Where a frame's tag starts in its payload: after the u64 request id.
_TAG_AT = 8


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


def encode_request(request_id: int, request: Request, max_frame_len: int = MAX_FRAME_LEN) -> bytes:
    """`encode_frame(ClientFrame(request_id, request), max_frame_len)`.

    A request made of integers only (`Report`, `Release`, `Cancel`, `Ping`) is
    packed with one precompiled layout, without building the `ClientFrame`.
    """
    fixed = FIXED_REQUESTS.get(type(request))
    if fixed is not None:
        layout, tag, names = fixed
        try:
            return layout.pack(
                layout.size - LENGTH_PREFIX_LEN,
                request_id,
                tag,
                *[getattr(request, name) for name in names],
            )
        except struct.error:
            pass  # not an int, or out of range: the codec below says which
    return encode_frame(ClientFrame(request_id, request), max_frame_len)


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

    Feed received bytes with `receive_data`, or receive straight into the
    decoder's own buffer: `get_buffer` gives the free space (for
    `socket.recv_into`), `buffer_updated` says how much was written, as with
    asyncio's `BufferedProtocol`. `next_frame` returns the next decoded frame
    or `NEED_DATA`; `next_answer` returns a `ServerFrame`'s request id and
    response without building the frame, decoding the fixed-size answers
    (`Granted`, `Settled`, ...) with one precompiled `struct` each.

    A length prefix above `max_frame_len` raises `FrameTooLarge` as soon as its
    4 bytes are there, before any of the payload is buffered; the stream is
    then unusable (the next frame cannot be found). A payload that does not
    decode raises `MalformedMessage` after the frame was consumed, so decoding
    can go on with the next frame. The buffer grows to hold one whole frame (at
    most `max_frame_len`) and shrinks back once it is empty.
    """

    def __init__(self, frame_type: type = ServerFrame, max_frame_len: int = MAX_FRAME_LEN) -> None:
        self.frame_type = frame_type
        self.max_frame_len = max_frame_len
        self._buffer = bytearray(BUFFER_SIZE)
        self._view = memoryview(self._buffer)
        self._start = 0  # the first byte not yet returned in a frame
        self._end = 0  # the end of the bytes received
        self._stop = 0  # the end of the payload `_next_payload` found last
        self._broken: Optional[FrameTooLarge] = None

    def receive_data(self, data: bytes) -> None:
        """Appends received bytes."""
        if self._broken is None:
            size = len(data)
            self._reserve(size)
            self._buffer[self._end : self._end + size] = data
            self._end += size

    def get_buffer(self) -> memoryview:
        """The free end of the buffer, to receive into; then call `buffer_updated`."""
        if self._end == 0 and len(self._buffer) == BUFFER_SIZE:
            return self._view  # empty, as between round trips: all of it
        free = len(self._buffer) - self._end
        if free < MIN_FREE or (self._end == 0 and free > BUFFER_SIZE):
            self._reserve(MIN_FREE)
        return self._view[self._end :]

    def buffer_updated(self, size: int) -> None:
        """`size` bytes were written at the start of the last `get_buffer`."""
        if self._broken is None:
            self._end += size

    @property
    def buffered(self) -> int:
        """Bytes received but not yet returned as frames."""
        return self._end - self._start

    def next_frame(self) -> Any:
        """The next complete frame, or `NEED_DATA`."""
        at = self._next_payload()
        if at is None:
            return NEED_DATA
        return decode_payload(bytes(self._view[at : self._stop]), self.frame_type)

    def next_answer(self) -> Any:
        """The next `(request_id, response)` of a `ServerFrame` stream, or `NEED_DATA`."""
        start, end = self._start, self._end
        buffer = self._buffer
        if end - start < LENGTH_PREFIX_LEN or self._broken is not None:
            if self._broken is None:
                return NEED_DATA
            at = self._next_payload()  # raises why the stream broke
        else:
            # `_next_payload` inline for a whole frame within the bound, the usual.
            at = start + LENGTH_PREFIX_LEN
            stop = at + _LENGTH.unpack_from(buffer, start)[0]
            if stop <= end and stop - at <= self.max_frame_len:
                self._stop = stop
                if stop == end:
                    self._start = self._end = 0
                else:
                    self._start = stop
            else:
                at = self._next_payload()
                if at is None:
                    return NEED_DATA
                buffer = self._buffer
        size = self._stop - at
        # The tag's low byte follows the u64 request id. A payload too short
        # to hold it is malformed: the generic decoder below says so, where
        # reading it would look past the payload, or past the buffer's end.
        fixed = FIXED_ANSWERS.get((size, buffer[at + _TAG_AT])) if size > _TAG_AT else None
        if fixed is not None:  # Granted, Settled, ...: integers only, one `unpack` each
            layout, tag, make = fixed
            values = layout.unpack_from(buffer, at)
            if values[1] == tag:
                return values[0], make(values)
        frame = decode_payload(bytes(self._view[at : self._stop]), ServerFrame)
        return frame.request_id, frame.response

    def frames(self) -> list[Any]:
        """Every complete frame buffered now (stops at the first error, raising it)."""
        out = []
        while True:
            frame = self.next_frame()
            if frame is NEED_DATA:
                return out
            out.append(frame)

    def _next_payload(self) -> Optional[int]:
        """Consumes the next whole frame and returns where its payload starts
        (it ends at `_stop`; the bytes stay until the next receive), or None
        while the frame is incomplete."""
        if self._broken is not None:
            raise self._broken
        start = self._start
        available = self._end - start
        if available < LENGTH_PREFIX_LEN:
            return None
        (size,) = _LENGTH.unpack_from(self._buffer, start)
        if size > self.max_frame_len:
            self._broken = FrameTooLarge(
                f"the peer announced a frame of {size} bytes; the maximum is {self.max_frame_len}"
            )
            self._start = self._end = 0
            raise self._broken
        stop = start + LENGTH_PREFIX_LEN + size
        if stop > self._end:
            if stop > len(self._buffer):
                self._reserve(stop - self._end)  # room for the whole frame
            return None
        self._stop = stop
        if stop == self._end:
            self._start = self._end = 0  # all consumed: the next bytes go to the front
        else:
            self._start = stop
        return start + LENGTH_PREFIX_LEN

    def _reserve(self, extra: int) -> None:
        """Makes room for `extra` more bytes after the buffered ones: moves them
        to the front, grows the buffer for a large frame, shrinks it once empty."""
        start, end = self._start, self._end
        buffered = end - start
        oversized = buffered == 0 and len(self._buffer) > BUFFER_SIZE
        if len(self._buffer) - end >= extra and not oversized:
            return
        kept = bytes(self._view[start:end])
        size = max(BUFFER_SIZE, buffered + extra)
        if oversized or size > len(self._buffer):  # a view given out keeps the old one
            self._buffer = bytearray(size)
            self._view = memoryview(self._buffer)
        self._buffer[:buffered] = kept
        self._start, self._end = 0, buffered


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
