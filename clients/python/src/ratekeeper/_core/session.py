"""The sans-IO state of one connection, shared by the sync and asyncio transports.

`Session` holds the request ids, the `Hello` exchange and the frame decoder;
`deliver_answers` and `connection_answer` say what the transports do with
what the decoder finds. The transports themselves (`_async/transport.py`,
`_sync/transport.py`) only move bytes and wake callers.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any, Optional

from .. import _proto as p
from .._proto.errors import ProtocolError, UnsupportedVersion, closes_connection
from .errors import ConnectionLost
from .requests import AcquireRequest, AnyRequest, Settlement
from .settings import clip_name

log = logging.getLogger("ratekeeper")


class Session:
    """The sans-IO state of one connection: ids, `Hello`, received bytes."""

    def __init__(self, client_name: str) -> None:
        self.client_name = clip_name(client_name)
        self.decoder = p.FrameDecoder(p.ServerFrame)
        self.hello: Optional[p.HelloReply] = None
        #: Most unanswered requests the daemon allows (announced in its `Hello`).
        self.max_in_flight = p.MAX_IN_FLIGHT
        #: The largest request payload: what the daemon announced, within the spec's bound.
        self.max_frame_len = p.MAX_FRAME_LEN
        self._last_id = 0

    def next_id(self) -> int:
        """A fresh request id: a counter from 1 that skips 0 if it ever wraps."""
        self._last_id = self._last_id % (2**64 - 1) + 1
        return self._last_id

    def hello_frame(self) -> tuple[int, bytes]:
        request_id = self.next_id()
        hello = p.Hello(protocol_version=p.PROTOCOL_VERSION, client_name=self.client_name)
        return request_id, p.encode_frame(p.ClientFrame(request_id, hello))

    def accept_hello(self, frame: p.ServerFrame) -> p.HelloReply:
        """Checks the daemon's answer to `Hello`; raises when it refused us."""
        response = frame.response
        if isinstance(response, p.ErrorReply):
            raise response.exception()
        if not isinstance(response, p.HelloReply):
            raise ProtocolError(f"expected Hello, the daemon answered {type(response).__name__}")
        if response.protocol_version != p.PROTOCOL_VERSION:
            raise UnsupportedVersion(
                f"the daemon speaks protocol version {response.protocol_version}; "
                f"this client speaks {p.PROTOCOL_VERSION}"
            )
        self.hello = response
        self.max_in_flight = response.max_in_flight
        self.max_frame_len = min(response.max_frame_len, p.MAX_FRAME_LEN)
        return response

    def receive_hello(self, hello_id: int, data: bytes) -> Optional[list[p.ServerFrame]]:
        """Feeds bytes received after `Hello`; None until its answer is in.

        Then checks the answer (raising when the daemon refused us) and returns
        the frames that arrived after it, for the connection to deliver.
        """
        self.decoder.receive_data(data)
        return self.hello_answer(hello_id)

    def hello_answer(self, hello_id: int) -> Optional[list[p.ServerFrame]]:
        """`receive_hello` for bytes already in the decoder (received into its buffer)."""
        frames = self.decoder.frames()
        if not frames:
            return None
        if frames[0].request_id not in (hello_id, 0):
            raise ProtocolError(f"answer to request {frames[0].request_id} before Hello")
        self.accept_hello(frames[0])
        return frames[1:]

    def request_frame(self, request: AnyRequest) -> tuple[int, bytes]:
        """Allocates an id for `request` and encodes it within the daemon's bound."""
        self._last_id = request_id = self._last_id % 18446744073709551615 + 1  # next_id
        kind = type(request)
        if kind is AcquireRequest or kind is Settlement:  # packed without a message
            return request_id, request.frame(request_id, self.max_frame_len)
        return request_id, p.encode_request(request_id, request, self.max_frame_len)

    def receive_data(self, data: bytes) -> Iterator[p.ServerFrame]:
        """Feeds `data`, then yields each frame it completed, in order.

        A broken stream raises `ProtocolError` after the frames before it.
        """
        decoder = self.decoder
        decoder.receive_data(data)
        while True:
            frame = decoder.next_frame()
            if frame is p.NEED_DATA:
                return
            yield frame


def connection_answer(response: p.Response) -> None:
    """An answer addressed to request id 0, about the connection itself.

    Raises the error when the daemon closes the connection after it (the
    connection then fails with it); anything else is logged and dropped.
    """
    if isinstance(response, p.ErrorReply) and closes_connection(response.code, 0):
        raise response.exception()
    log.warning("the sidecar sent a connection-level answer: %r", response)


#: The requests answered at once, which never count against the daemon's
#: in-flight bound (PROTOCOL.md §5.2): `type(request) not in NOT_COUNTED`.
NOT_COUNTED = frozenset((p.Ping, p.Cancel))


def deliver_answers(decoder: p.FrameDecoder, deliver: Any) -> Optional[ConnectionLost]:
    """Hands every whole answer in `decoder` to `deliver(request_id, response)`;
    on a protocol error, why the connection must close."""
    try:
        answer = decoder.next_answer()
        while answer is not p.NEED_DATA:
            deliver(answer[0], answer[1])
            answer = decoder.next_answer()
    except ProtocolError as error:
        log.error("closing the connection to the sidecar: %s", error)
        return ConnectionLost(f"protocol error: {error}")
    return None
